package procscrub

import (
	"bytes"
	"strings"
)

// Mask is what a hidden byte becomes.
const Mask = '*'

// MaskEnv returns block (NUL-separated NAME=value entries, as
// /proc/<pid>/environ holds them) with the value of every entry whose name
// secret reports masked, byte for byte, so every entry keeps its place and
// length. changed says whether anything was masked.
func MaskEnv(block []byte, secret func(name string) bool) (out []byte, changed bool) {
	out = bytes.Clone(block)
	off := 0
	for _, e := range bytes.Split(block, []byte{0}) {
		if name, _, ok := bytes.Cut(e, []byte{'='}); ok && secret(string(name)) {
			for i := off + len(name) + 1; i < off+len(e); i++ {
				if out[i] != Mask {
					out[i], changed = Mask, true
				}
			}
		}
		off += len(e) + 1
	}
	return out, changed
}

// MaskArgs returns block (NUL-separated arguments, as /proc/<pid>/cmdline
// holds them) with the arguments replaced by mask(args), which must return
// one string per argument, each of the same length as the argument (a
// masked copy). It returns block unchanged when block does not hold exactly
// args, or mask breaks that rule.
func MaskArgs(block []byte, args []string, mask func([]string) []string) (out []byte, changed bool) {
	if string(block) != strings.Join(args, "\x00")+"\x00" && string(block) != strings.Join(args, "\x00") {
		return block, false
	}
	masked := mask(args)
	if len(masked) != len(args) {
		return block, false
	}
	out = bytes.Clone(block)
	off := 0
	for i, a := range args {
		if len(masked[i]) != len(a) {
			return block, false
		}
		if masked[i] != a {
			copy(out[off:], masked[i])
			changed = true
		}
		off += len(a) + 1
	}
	return out, changed
}

// MaskURLPassword masks the password of every URL in s (a comma-separated
// list, as --nats-url takes), keeping its length.
func MaskURLPassword(s string) string {
	parts := strings.Split(s, ",")
	for i, p := range parts {
		scheme := strings.Index(p, "://")
		if scheme < 0 {
			continue
		}
		rest := p[scheme+3:]
		at := strings.LastIndexByte(rest, '@')
		if slash := strings.IndexByte(rest, '/'); slash >= 0 && slash < at {
			at = -1
		}
		if at < 0 {
			continue
		}
		colon := strings.IndexByte(rest[:at], ':')
		if colon < 0 {
			// A token alone (nats://token@host) is a secret too.
			parts[i] = p[:scheme+3] + strings.Repeat(string(Mask), at) + rest[at:]
			continue
		}
		parts[i] = p[:scheme+3] + rest[:colon+1] + strings.Repeat(string(Mask), at-colon-1) + rest[at:]
	}
	return strings.Join(parts, ",")
}
