// Package sandboxtest holds the test suite every sandbox.Provider must pass,
// and a child mode that turns a Go test binary into a scriptable program to
// run inside sandboxes.
//
// # Child mode
//
// Tests run the test binary itself as the sandboxed program instead of sh,
// sleep or a real agent, so they behave the same on every machine. The test
// package's TestMain calls RunChild first:
//
//	func TestMain(m *testing.M) {
//		if !sandboxtest.RunChild() {
//			os.Exit(m.Run())
//		}
//	}
//
// ChildArgv("echo hello", "exit 3") returns
// [<test binary>, "--sandboxtest-child", "echo hello", "exit 3"]. The child
// marker is an argument, not an environment variable, because sandboxes pass
// only allow-listed variables to their processes. Arguments from the first
// one starting with "-" on are not steps, so a caller may append its own flags
// (an agent runner appending "-p … -- <prompt>") and check them with the
// "args" step. RunChild documents every step.
//
// # The shared suite
//
// Exercise(t, newProvider, Features{…}) runs the contract of package sandbox
// against one provider: streaming and ordering of stdout, exit codes and
// signals, stdin delivery and close, stderr draining (1 MiB before any
// stdout must not deadlock) and its kept tail, Stop's SIGTERM → grace →
// SIGKILL escalation, no surviving grandchild after exit, Stop or Destroy,
// workspace files and path escapes, Destroy's idempotence, and the
// environment policy (worker secrets and CLAUDECODE never reach a child,
// HOME and CLAUDE_CONFIG_DIR are the sandbox's own). Differences between
// providers live in Features, never in per-provider branches. Exercise uses
// t.Setenv, so it must not be called from a parallel test.
package sandboxtest
