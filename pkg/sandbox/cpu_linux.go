package sandbox

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"
)

var _ CPUMeter = (*localSandbox)(nil)

// clockTicks is the unit of /proc/<pid>/stat's utime and stime (USER_HZ,
// 100 on every Linux architecture Go supports).
const clockTicks = 100

// CPUTime sums the CPU time of the sandbox's live processes: each one's
// cgroup (cpu.stat usage_usec) when it runs in a group of its own, else
// its process group (utime+stime of every process of the group, from
// /proc). A process that left its group (setsid) outside a cgroup is not
// counted.
func (s *localSandbox) CPUTime() (time.Duration, error) {
	s.mu.Lock()
	var groups []int
	var dirs []string
	for _, p := range s.procs {
		select {
		case <-p.done:
			continue
		default:
		}
		if r, ok := p.run.(*cgroupRun); ok && r.dir != "" {
			dirs = append(dirs, r.dir)
			continue
		}
		groups = append(groups, p.pid)
	}
	s.mu.Unlock()
	var total time.Duration
	for _, d := range dirs {
		v, err := cgroupCPU(d)
		if err != nil {
			return 0, err
		}
		total += v
	}
	if len(groups) > 0 {
		v, err := groupsCPU(groups)
		if err != nil {
			return 0, err
		}
		total += v
	}
	return total, nil
}

// cgroupCPU reads usage_usec of dir/cpu.stat.
func cgroupCPU(dir string) (time.Duration, error) {
	b, err := os.ReadFile(filepath.Join(dir, "cpu.stat"))
	if err != nil {
		return 0, fmt.Errorf("sandbox: cpu.stat: %w: %v", ErrUnavailable, err)
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		if v, ok := bytes.CutPrefix(sc.Bytes(), []byte("usage_usec ")); ok {
			n, err := strconv.ParseInt(string(v), 10, 64)
			if err != nil {
				return 0, fmt.Errorf("sandbox: cpu.stat usage_usec %q: %w", v, ErrUnavailable)
			}
			return time.Duration(n) * time.Microsecond, nil
		}
	}
	return 0, fmt.Errorf("sandbox: cpu.stat has no usage_usec: %w", ErrUnavailable)
}

// groupsCPU sums utime+stime of every process whose process group is one
// of groups.
func groupsCPU(groups []int) (time.Duration, error) {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return 0, fmt.Errorf("sandbox: /proc: %w: %v", ErrUnavailable, err)
	}
	var ticks int64
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
		if err != nil {
			continue // gone since
		}
		pgrp, t, ok := parseStat(b)
		if !ok {
			continue
		}
		for _, g := range groups {
			if pgrp == g {
				ticks += t
				break
			}
		}
	}
	return time.Duration(ticks) * time.Second / clockTicks, nil
}

// parseStat reads the process group (field 5) and utime+stime (fields 14
// and 15) of a /proc/<pid>/stat line. The command (field 2) is in
// parentheses and may hold spaces and parentheses: fields are counted
// from the last ')'.
func parseStat(b []byte) (pgrp int, ticks int64, ok bool) {
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, 0, false
	}
	f := bytes.Fields(b[i+1:])
	// f[0] is field 3 (state): field n is f[n-3].
	if len(f) < 13 {
		return 0, 0, false
	}
	g, err1 := strconv.Atoi(string(f[2]))
	u, err2 := strconv.ParseInt(string(f[11]), 10, 64)
	s, err3 := strconv.ParseInt(string(f[12]), 10, 64)
	if err1 != nil || err2 != nil || err3 != nil {
		return 0, 0, false
	}
	return g, u + s, true
}
