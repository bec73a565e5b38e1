// Package warm keeps agents started ahead of the jobs that will use them
// (docs/warm.md): per option profile, up to Config.N agents, each already
// spawned in its sandbox in stream-json input mode and waiting for its
// first user message. A job whose profile matches takes one with
// [Pool.Take] and writes its prompt as that first message
// ([Agent.Begin]); Claude Code writes nothing before its first input, so
// what is left of its start is the CLI's own time from input to first
// line.
//
// # Profiles
//
// A [Profile] is everything that shapes an agent's argv and environment:
// the options that become flags (model, permission mode, allowed and
// disallowed tools, system prompts, max turns and budget), the options'
// environment, whether permission requests are relayed, the sandbox
// provider, the network policy and the MCP configuration. It is a
// comparable value, so it keys a map. [ProfileOf] computes it from a job,
// and says why a job must start cold instead (a resumed session, whose
// files are restored before the agent starts; a workspace or a setup
// script, whose checkout the CLI reads while it starts).
//
// # One job per agent
//
// An agent handed out by Take is the taker's: the pool forgets it and
// starts another in the background. It is never handed out twice. The
// taker ends it with [Agent.Close] (or lets it exit), which also releases
// its sandbox. The replacement starts Config.RefillDelay after the Take,
// so its start does not compete for CPU with the taken agent's first
// answer.
//
// # What is bound at Take (the contract of the spawn hook)
//
// The environment of a process is fixed when it is spawned, and a warm
// agent is spawned before anyone knows which run it will serve. So
// whatever is per run must not be in it as a value of the run: the
// [SpawnFunc] mints what the environment needs without a run (the model
// gateway's token of docs/gateway.md, minted unbound: the gateway answers 401 to
// it until it is bound) and returns a [BindFunc]. [Agent.Begin] calls the
// BindFunc with the run (tenant and job id) before it writes the first
// user message, so the first model call the agent makes is already metered
// and capped as the run's; the release func returned by the spawn hook
// revokes the token. A warm agent that is never taken has a token that
// was never valid for any run. Neither the job id nor the tenant may be in
// a warm agent's argv or environment.
//
// # Lifecycle and cost
//
// The pool is a [startstop.Service]: Start begins filling, Stop (drain and
// shutdown) stops every agent that was not taken and waits for the spawns
// under way. An agent that dies while it waits is dropped and replaced; a
// spawn that fails is retried after a backoff that doubles up to a minute.
// With Config.Handshake the pool sends Claude Code's initialize control
// request (what the Agent SDK sends) and lists the agent only once the CLI
// answered it, so a taken agent has finished starting. An idle warm agent
// blocks reading its stdin: it costs memory (about 170 MB for Claude
// Code), not CPU.
package warm
