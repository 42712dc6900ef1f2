package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/pdplane/pdplane/cli"
)

// runHealthcheck is the container image's HEALTHCHECK: GET --url and exit
// 0 on a 2xx answer, 1 otherwise. The control-plane image has no shell or
// curl, so the binary probes itself.
func runHealthcheck(ctx context.Context, args []string) error {
	var url string
	var timeout time.Duration
	fs := cli.NewFlagSet("healthcheck")
	fs.Str(&url, "url", defaultHealthURL(os.Getenv("PDPLANE_ADDR")), "URL to GET; 2xx is healthy "+
		"(default: /healthz on the port of $PDPLANE_ADDR, or 8080, at 127.0.0.1)")
	fs.Dur(&timeout, "timeout", 3*time.Second, "time limit of the request")
	if err := fs.Parse(args); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<16))
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return nil
}

// defaultHealthURL is /healthz of pdplane serve listening on addr
// (serve's --addr): its host unless that is a wildcard, else 127.0.0.1.
func defaultHealthURL(addr string) string {
	host, port, err := net.SplitHostPort(addr)
	if err != nil || port == "" {
		host, port = "", "8080"
	}
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		host = "127.0.0.1"
	}
	return "http://" + net.JoinHostPort(host, port) + "/healthz"
}
