package agent

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// loadCredential reads the credential kept in path; "" when path is empty
// or the file does not exist yet.
func loadCredential(path string) (string, error) {
	if path == "" {
		return "", nil
	}
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("agent: read credential file: %w", err)
	}
	return strings.TrimSpace(string(data)), nil
}

// saveCredential replaces the file at path with the credential, readable
// by its owner only. It writes a temporary file and renames it, so a crash
// leaves the old credential or the new one, never half of one.
func saveCredential(path, credential string) error {
	if path == "" {
		return nil
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return fmt.Errorf("write credential file: %w", err)
	}
	defer os.Remove(tmp.Name()) // after a successful rename there is nothing to remove
	if err := tmp.Chmod(0o600); err != nil {
		tmp.Close()
		return fmt.Errorf("write credential file: %w", err)
	}
	if _, err := tmp.WriteString(credential + "\n"); err != nil {
		tmp.Close()
		return fmt.Errorf("write credential file: %w", err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return fmt.Errorf("write credential file: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("write credential file: %w", err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("write credential file: %w", err)
	}
	return nil
}
