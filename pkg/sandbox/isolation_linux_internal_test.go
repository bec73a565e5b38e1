package sandbox

import (
	"strings"
	"testing"
)

// TestBwrapHintNamesTheFix: bwrap's messages where containers and hosts
// refuse it get the setting that allows it.
func TestBwrapHintNamesTheFix(t *testing.T) {
	for said, want := range map[string]string{
		"bwrap: Can't mount proc on /newroot/proc: Operation not permitted":               "--security-opt unmask=/proc/*",
		"bwrap: Creating new namespace failed: Operation not permitted":                   "seccomp",
		"bwrap: No permissions to creating new namespace, likely because the kernel does": "user.max_user_namespaces",
		"bwrap: setting up uid map: Permission denied":                                    "AppArmor",
		"bwrap: loopback: Failed RTM_NEWADDR: Operation not permitted":                    "AppArmor",
	} {
		if got := bwrapHint(said); !strings.Contains(got, want) {
			t.Errorf("bwrapHint(%q) = %q, want it to name %q", said, got, want)
		}
	}
	if got := bwrapHint("bwrap: something else"); got != "" {
		t.Errorf("an unknown message got a hint: %q", got)
	}
}
