// Package api is generated from openapi.yaml by oapi-codegen: the control
// plane's models, chi server, strict server and client. Never edit
// api.gen.go by hand; change openapi.yaml and run `go generate ./...`.
package api

//go:generate go tool oapi-codegen -config cfg.yaml ../../openapi.yaml
