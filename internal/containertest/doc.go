// Package containertest runs the fleet in containers: the images `make
// images` builds (worker, dispatcher, nats) under rootful podman, on a
// podman network, with ports published on loopback. It is built only with
// the build tag `containers` and run by `make test/containers`
// (scripts/test-containers.sh builds the images first and passes their tag
// in FLEET_CONTAINER_TAG).
//
// What it checks: a worker in its image runs contained with only
// `--security-opt unmask=/proc/*` and says so; a tenant's jobs run through
// its NATS creds (the dispatcher CLI on the host) and through /v1 (its
// token); from inside a contained agent the worker's creds, its data and
// another run's files are out of reach and /tmp is writable; a worker
// killed with SIGKILL mid-job hands the job to the other, which ends it
// once; a worker stopped with SIGTERM drains; and an image started without
// creds, with a tenant's creds, or where bubblewrap cannot run exits at
// once naming the cause.
package containertest
