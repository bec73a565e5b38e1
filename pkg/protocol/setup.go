package protocol

// MaxSetupBytes is the longest setup script a job may carry (64 KiB).
const MaxSetupBytes = 64 << 10

// validateSetup checks the job field setup (docs/warm.md): optional; a shell
// script run in the checkout before the agent starts, valid UTF-8 without
// NUL bytes (it becomes an argument of sh -c), at most MaxSetupBytes.
func validateSetup(s string) error {
	if s == "" {
		return nil
	}
	return checkString("setup", s, MaxSetupBytes)
}

// CodeSetup is error.code of a run whose setup script failed or did not
// finish (docs/warm.md); the agent never started.
const CodeSetup = "setup"
