# agentfleet images, assembled from binaries built outside (the GoReleaser
# pattern): `make images` builds the static Go binaries and fetches the pinned
# Claude Code executable into bin/image/, then builds each target with
# bin/image/ as the build context. No Go toolchain or Node runs in here.
#
#   make images                         # agentfleet/{worker,dispatcher,nats}:dev
#   make images BASE_IMAGE=localhost/agentfleet/base:bookworm   # after make images/base
#
# Targets: worker, dispatcher, nats. BASE_IMAGE is any Debian bookworm (the
# public debian:bookworm-slim by default, or the local base `make images/base`
# bootstraps with mmdebstrap where no registry can be reached).
ARG BASE_IMAGE=docker.io/library/debian:bookworm-slim

# The worker: bubblewrap for contained agents, git for workspaces,
# ca-certificates, tini as PID 1, the Claude Code CLI (a native executable
# since 2.1: no Node at run time) and the bundled stand-in agent.
FROM ${BASE_IMAGE} AS worker
RUN set -eu; need=""; \
    for p in bubblewrap ca-certificates git tini; do dpkg -s "$p" >/dev/null 2>&1 || need="$need $p"; done; \
    if [ -n "$need" ]; then \
        apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends $need; \
        rm -rf /var/lib/apt/lists/*; \
    fi; \
    groupadd --gid 10001 fleet; \
    useradd --uid 10001 --gid 10001 --home-dir /home/fleet --create-home --shell /usr/sbin/nologin fleet; \
    install -d -o 10001 -g 10001 -m 0700 /data /run/fleet
COPY worker fleet-standin-agent claude /usr/local/bin/
USER 10001:10001
WORKDIR /data
# Contained by default: the worker refuses to start when bubblewrap cannot
# make its namespaces (run with podman's --security-opt unmask=/proc/*, or
# procMount: Unmasked in Kubernetes); FLEET_ISOLATION=none only on dedicated
# nodes. Data (journal, sandboxes) under /data, 0700 and the worker's own;
# the creds go to /run/fleet/worker.creds, 0600 and the worker's own.
ENV FLEET_ISOLATION=contained \
    FLEET_JOURNAL_DIR=/data/journal \
    FLEET_SANDBOX_DIR=/data/sandboxes \
    FLEET_NATS_CREDS=/run/fleet/worker.creds \
    FLEET_HTTP=0.0.0.0:8080 \
    FLEET_AGENT_CMD=claude
EXPOSE 8080
STOPSIGNAL SIGTERM
# tini as PID 1 reaps what an agent left behind once the worker has killed it
# and passes SIGTERM on to the worker, which drains (--shutdown-grace).
ENTRYPOINT ["/usr/bin/tini", "--", "/usr/local/bin/worker"]

# A root file system for the static images: the CA bundle, a passwd naming
# the users, and their data directories.
FROM ${BASE_IMAGE} AS staticroot
RUN set -eu; mkdir -p /out/etc/ssl/certs /out/data/nats /out/run/fleet /out/tmp; \
    if [ -f /etc/ssl/certs/ca-certificates.crt ]; then cp /etc/ssl/certs/ca-certificates.crt /out/etc/ssl/certs/; fi; \
    printf 'root:x:0:0:root:/:/sbin/nologin\nfleet:x:10002:10002:fleet:/data:/sbin/nologin\nnobody:x:65534:65534:nobody:/:/sbin/nologin\n' > /out/etc/passwd; \
    printf 'root:x:0:\nfleet:x:10002:\nnogroup:x:65534:\n' > /out/etc/group; \
    chown -R 10002:10002 /out/data /out/run/fleet; chmod 0700 /out/data /out/data/nats /out/run/fleet; chmod 1777 /out/tmp

# The dispatcher: one static binary, non-root.
FROM scratch AS dispatcher
COPY --from=staticroot /out/ /
COPY dispatcher /usr/local/bin/dispatcher
USER 10002:10002
WORKDIR /data
ENV FLEET_HTTP=0.0.0.0:8080 \
    FLEET_NATS_CREDS=/run/fleet/dispatcher.creds \
    SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/dispatcher"]
CMD ["serve"]

# nats-server, built from the Go module go.mod pins, for compose and tests
# where no public image can be pulled. Non-root; JetStream under /data/nats.
FROM scratch AS nats
COPY --from=staticroot /out/ /
COPY nats-server /usr/local/bin/nats-server
USER 10002:10002
WORKDIR /data
EXPOSE 4222 8222
ENTRYPOINT ["/usr/local/bin/nats-server"]
