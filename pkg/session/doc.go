// Package session runs one agent process as a multi-turn session (docs/sessions.md):
// Claude Code in stream-json input mode (`claude -p --input-format
// stream-json --output-format stream-json --verbose --replay-user-messages`,
// plus `--permission-prompt-tool stdio` for remote approvals), its stdin
// held open through the sandbox's optional Interactive ability.
//
// # Turns
//
// Start starts the process; it writes nothing until its first input. Turn
// writes one user message and returns when the turn's result line has been
// emitted (or, when the process died or was stopped, after the synthetic
// result the session wrote, as pkg/agent does for one-shot runs). A caller
// writes the next input only after Turn returned: Claude Code merges lines
// written during a turn into one next turn, so queueing belongs to the
// caller. Every line the process writes goes to the EmitFunc, in order, from
// one goroutine, between turns too (control responses, lifecycle lines).
//
// # Control
//
// Interrupt ends the running turn (a control_request of subtype interrupt;
// the CLI answers and ends the turn with an error_during_execution result;
// the process goes on). Permission requests (control_request can_use_tool)
// are recorded as pending and reported to Spec.OnRequest after they were
// emitted; Respond answers one (allow, with the tool's input or an updated
// one, or deny with a message).
//
// # Ending
//
// Close closes stdin, gives the process a grace period to exit (the CLI
// exits about a second after EOF), then stops its group. A cancelled or
// handed-back Turn stops the process at once.
//
// # Checkpoints
//
// SessionFiles reads what Claude Code keeps for a session out of the
// sandbox, as a tar archive: the transcript
// ($CLAUDE_CONFIG_DIR/projects/<project>/<session id>.jsonl) and the
// session's directory beside it (<session id>/: Claude Code 2.1.330 keeps
// its Task subagents' transcripts in subagents/). It is bounded
// (DefaultMaxFilesBytes; over it, ErrTooLarge before anything is copied).
// RestoreFiles vets an archive (CheckFiles), removes every other copy of
// the session from the sandbox's config dir and unpacks the archive into
// projects/RestoreProject, so that `--resume <session id>` continues from
// exactly the checkpoint on any worker (Claude Code looks the id up in
// every project directory of its config dir, and keeps writing there).
// Both run small helper programs in the sandbox (printenv, find, tar,
// mkdir, rm: argv, never a shell), so one implementation serves every
// provider.
package session
