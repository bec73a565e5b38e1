package procscrub_test

import (
	"bufio"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"golang.org/x/sys/unix"

	"github.com/agentfleet/agentfleet/internal/procscrub"
)

// The child mode: scrub, say what Go still sees, then wait for stdin to close.
func TestMain(m *testing.M) {
	if os.Getenv("PROCSCRUB_CHILD") == "1" {
		err := procscrub.Scrub(func(n string) bool { return strings.HasPrefix(n, "SECRET_") }, func(args []string) []string {
			out := make([]string, len(args))
			for i, a := range args {
				out[i] = procscrub.MaskURLPassword(a)
			}
			return out
		})
		if err != nil {
			os.Stdout.WriteString("error " + err.Error() + "\n")
		}
		dumpable, _ := unix.PrctlRetInt(unix.PR_GET_DUMPABLE, 0, 0, 0, 0)
		os.Stdout.WriteString("go sees " + os.Getenv("SECRET_TOKEN") + " " + os.Args[len(os.Args)-1] + " dumpable " + strconv.Itoa(dumpable) + "\n")
		_, _ = bufio.NewReader(os.Stdin).ReadString('\n')
		os.Exit(0)
	}
	goleak.VerifyTestMain(m)
}

// Another process reading the scrubbed process's /proc/<pid>/environ and
// cmdline finds no secret, while the process itself still has them, and the
// process is no longer dumpable (a non-root process of the same user can
// read neither those files nor its memory).
func TestScrubHidesSecretsFromProc(t *testing.T) {
	t.Parallel()
	exe, err := os.Executable()
	require.NoError(t, err)
	cmd := exec.Command(exe, "-test.run=^$", "nats://user:pass-in-argv@127.0.0.1:4222")
	cmd.Env = append(os.Environ(), "PROCSCRUB_CHILD=1", "SECRET_TOKEN=tok-in-env", "PLAIN=visible")
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	defer func() { _ = stdin.Close(); _ = cmd.Wait() }()
	line, err := bufio.NewReader(out).ReadString('\n')
	require.NoError(t, err)
	require.Equal(t, "go sees tok-in-env nats://user:pass-in-argv@127.0.0.1:4222 dumpable 0\n", line,
		"the process keeps its values and is not dumpable")

	proc := "/proc/" + strconv.Itoa(cmd.Process.Pid)
	env, err := os.ReadFile(proc + "/environ")
	require.NoError(t, err, "root reads it; the assertion is on what it shows")
	require.NotContains(t, string(env), "tok-in-env")
	require.Contains(t, string(env), "\x00SECRET_TOKEN=**********\x00")
	require.Contains(t, string(env), "\x00PLAIN=visible\x00")
	args, err := os.ReadFile(proc + "/cmdline")
	require.NoError(t, err)
	require.NotContains(t, string(args), "pass-in-argv")
	require.Contains(t, string(args), "\x00nats://user:************@127.0.0.1:4222\x00")
}

func TestMaskURLPassword(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"nats://u:pw@h:4222":                "nats://u:**@h:4222",
		"nats://tok@h":                      "nats://***@h",
		"nats://h:4222":                     "nats://h:4222",
		"nats://a:b@h1,nats://c:dd@h2":      "nats://a:*@h1,nats://c:**@h2",
		"https://h/path@x":                  "https://h/path@x",
		"--cf-bridge-url=https://u:p@b.dev": "--cf-bridge-url=https://u:*@b.dev",
		"plain":                             "plain",
	} {
		require.Equal(t, want, procscrub.MaskURLPassword(in), in)
	}
}

func TestMaskArgsRefusesWhatItCannotPlace(t *testing.T) {
	t.Parallel()
	block := []byte("a\x00bb\x00")
	same := func(a []string) []string { return a }
	out, changed := procscrub.MaskArgs(block, []string{"a", "bb"}, func(a []string) []string { return []string{"*", "bb"} })
	require.True(t, changed)
	require.Equal(t, "*\x00bb\x00", string(out))
	_, changed = procscrub.MaskArgs(block, []string{"a", "b"}, same)
	require.False(t, changed, "the block does not hold these arguments")
	_, changed = procscrub.MaskArgs(block, []string{"a", "bb"}, func(a []string) []string { return []string{"**", "bb"} })
	require.False(t, changed, "a mask of another length")
}

// FuzzMaskEnv: whatever the block, masking keeps its length and its NULs
// and touches only values of secret names.
func FuzzMaskEnv(f *testing.F) {
	f.Add([]byte("A=1\x00SECRET_X=abc\x00B=\x00"))
	f.Add([]byte("SECRET_=\x00=x\x00noequals\x00"))
	f.Fuzz(func(t *testing.T, block []byte) {
		out, _ := procscrub.MaskEnv(block, func(n string) bool { return strings.HasPrefix(n, "SECRET_") })
		require.Len(t, out, len(block))
		for i := range block {
			if block[i] == 0 || out[i] != block[i] {
				require.Equal(t, block[i] == 0, out[i] == 0, "NULs stay where they are")
			}
		}
	})
}

// FuzzMaskURLPassword: the mask keeps the length.
func FuzzMaskURLPassword(f *testing.F) {
	f.Add("nats://u:pw@h:4222,nats://tok@h2")
	f.Add("://@:")
	f.Fuzz(func(t *testing.T, s string) {
		require.Len(t, procscrub.MaskURLPassword(s), len(s))
	})
}
