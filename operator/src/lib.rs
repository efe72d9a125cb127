//! isthmus operator: the NetworkLink API, the pure index and plan computation, and the controller around them.
//!
//! - [`api`]: the `NetworkLink` custom resource, with its schema, presets and resolution into impairments;
//! - [`unit_syntax`]: the one parser of durations, percentages, rates and sizes;
//! - [`clock`]: now, in the whole seconds the API server keeps;
//! - [`index`]: an in-memory store of the Kubernetes objects that matter, fed by watch events;
//! - [`plan`]: the pure, incremental computation of each node's plan and each link's status facts;
//! - [`failure`]: why a pod is not shaped and why an agent call failed, each spelled once;
//! - [`flags`]: the operator binary's command line and the configurations it makes;
//! - [`gate`]: the pod readiness gate `isthmus.dev/links-applied`: its condition and reasons;
//! - [`controller`]: watches, per-node dispatch to the agents, status and the cleanup finalizer;
//! - [`leader`]: leader election on a Lease, fenced on the Lease's own expiry;
//! - [`metrics`], [`telemetry`]: the Prometheus metrics, logging and the `/metrics`, `/healthz`, `/readyz` server;
//! - [`https`], [`metrics_https`]: the operator's HTTPS listeners, and `/metrics` by ServiceAccount token on one;
//! - [`topology`]: the `NetworkTopology` resource, its expansion into NetworkLinks and their reconciler;
//! - [`admission`]: the validating webhook that admits a NetworkTopology exactly when it expands;
//! - [`uninstall`]: `isthmus-operator uninstall`, the chart's pre-delete hook.

pub mod admission;
pub mod api;
pub mod clock;
pub mod controller;
pub mod failure;
pub mod flags;
pub mod gate;
pub mod https;
pub mod index;
pub mod leader;
pub mod measure;
pub mod metrics;
pub mod metrics_https;
pub mod pki;
pub mod plan;
pub mod schedule;
pub mod telemetry;
pub mod topology;
pub mod uninstall;
pub mod unit_syntax;
pub mod wait_for_links;
