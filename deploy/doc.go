// Package deploy holds no code: its folders hold the deployment artifacts
// (Kubernetes manifests in kubernetes/, systemd units in systemd/, and the
// config files they pass to pdplane), and its tests validate them offline
// against the Kubernetes API types, against each other, and against the
// flags and config files the pdplane binary really accepts.
package deploy
