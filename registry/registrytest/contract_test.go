package registrytest_test

import (
	"testing"

	"github.com/pdplane/pdplane/registry"
	"github.com/pdplane/pdplane/registry/memstore"
	"github.com/pdplane/pdplane/registry/pgstore"
	"github.com/pdplane/pdplane/registry/registrytest"
)

func TestContract(t *testing.T) {
	t.Parallel()
	t.Run("memstore", func(t *testing.T) {
		t.Parallel()
		registrytest.RunContract(t, func(t *testing.T) registry.Store {
			return memstore.New(memstore.Config{QuarantineTTL: registrytest.QuarantineTTL, Heal: registrytest.Heal})
		})
	})
	t.Run("pgstore", func(t *testing.T) {
		t.Parallel()
		registrytest.RunContract(t, func(t *testing.T) registry.Store {
			s, _ := registrytest.NewPGStore(t, pgstore.Config{QuarantineTTL: registrytest.QuarantineTTL, Heal: registrytest.Heal})
			return s
		})
	})
}
