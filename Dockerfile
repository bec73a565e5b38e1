# syntax=docker/dockerfile:1
# agentfleet images: `worker` (with Claude Code installed) and `dispatcher`.
#   docker build --target worker -t agentfleet-worker .
#   docker build --target dispatcher -t agentfleet-dispatcher .

FROM golang:1.26-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ENV CGO_ENABLED=0
RUN go build -trimpath -o /out/worker ./cmd/worker \
 && go build -trimpath -o /out/dispatcher ./cmd/dispatcher \
 && go build -trimpath -o /out/fleet-standin-agent ./cmd/fleet-standin-agent

# The worker runs agents as local child processes, so its image carries the
# agent: Claude Code (needs Node) plus the bundled stand-in for offline runs,
# and bubblewrap, which contains them (docs/contained.md). The worker refuses
# to start where it cannot contain (the container needs user namespaces and
# an unmasked /proc: see docker-compose.yml) unless FLEET_ISOLATION=none.
FROM node:22-bookworm-slim AS worker
ARG CLAUDE_CODE_VERSION=2.1.330
RUN npm install -g "@anthropic-ai/claude-code@${CLAUDE_CODE_VERSION}" \
 && apt-get update && apt-get install -y --no-install-recommends git ca-certificates tini bubblewrap \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --create-home --uid 10001 fleet \
 && mkdir -p /data /journal /sandboxes && chown fleet:fleet /data /journal /sandboxes
COPY --from=build /out/worker /out/fleet-standin-agent /usr/local/bin/
USER fleet
WORKDIR /home/fleet
ENV FLEET_JOURNAL_DIR=/journal FLEET_SANDBOX_DIR=/sandboxes FLEET_HTTP=0.0.0.0:8080
EXPOSE 8080
STOPSIGNAL SIGTERM
# tini as PID 1 reaps what an agent left behind once the worker has killed it
# (a process that detached from the agent is re-parented to PID 1, and the
# worker would otherwise keep it as a zombie) and passes SIGTERM on.
ENTRYPOINT ["/usr/bin/tini", "--", "worker"]

FROM gcr.io/distroless/static-debian12:nonroot AS dispatcher
COPY --from=build /out/dispatcher /usr/local/bin/dispatcher
ENV FLEET_HTTP=0.0.0.0:8080
EXPOSE 8080
ENTRYPOINT ["dispatcher"]
CMD ["serve"]
