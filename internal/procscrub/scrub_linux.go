package procscrub

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Scrub masks, in this process's original environment and argument block,
// the values of the environment variables secretEnv reports and what
// maskArgs masks in os.Args (see MaskArgs), then marks the process
// non-dumpable. Call it at the start of main, before anything reads
// os.Args: Go's environment is a copy, but os.Args points into the block,
// so Scrub first replaces it with copies; the process keeps the real
// values. An error says what could not be done; the process is fine
// either way.
func Scrub(secretEnv func(string) bool, maskArgs func([]string) []string) error {
	for i, a := range os.Args {
		os.Args[i] = strings.Clone(a)
	}
	var errs []string
	if err := scrubBlocks(secretEnv, maskArgs); err != nil {
		errs = append(errs, err.Error())
	}
	if err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0); err != nil {
		errs = append(errs, "PR_SET_DUMPABLE: "+err.Error())
	}
	if len(errs) > 0 {
		return fmt.Errorf("procscrub: %s", strings.Join(errs, "; "))
	}
	return nil
}

func scrubBlocks(secretEnv func(string) bool, maskArgs func([]string) []string) error {
	stat, err := os.ReadFile("/proc/self/stat")
	if err != nil {
		return err
	}
	// Fields after the command name (which may hold spaces): field 3 is
	// the first; arg_start..env_end are fields 48..51.
	f := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+2:]))
	if len(f) < 49 {
		return fmt.Errorf("/proc/self/stat has %d fields after the name; too old a kernel", len(f)+2)
	}
	var addr [4]int64
	for i := range addr {
		if addr[i], err = strconv.ParseInt(f[45+i], 10, 64); err != nil {
			return fmt.Errorf("/proc/self/stat field %d: %w", 48+i, err)
		}
	}
	mem, err := os.OpenFile("/proc/self/mem", os.O_RDWR, 0)
	if err != nil {
		return err
	}
	defer mem.Close()
	rewrite := func(start, end int64, mask func([]byte) ([]byte, bool)) error {
		if end <= start {
			return nil
		}
		block := make([]byte, end-start)
		if _, err := mem.ReadAt(block, start); err != nil {
			return err
		}
		out, changed := mask(block)
		if !changed {
			return nil
		}
		_, err := mem.WriteAt(out, start)
		return err
	}
	if maskArgs != nil {
		if err := rewrite(addr[0], addr[1], func(b []byte) ([]byte, bool) { return MaskArgs(b, os.Args, maskArgs) }); err != nil {
			return fmt.Errorf("arguments: %w", err)
		}
	}
	if secretEnv != nil {
		if err := rewrite(addr[2], addr[3], func(b []byte) ([]byte, bool) { return MaskEnv(b, secretEnv) }); err != nil {
			return fmt.Errorf("environment: %w", err)
		}
	}
	return nil
}
