package journal

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/require"
)

type scanned struct {
	off  int64
	seq  uint64
	data string
}

func scanBytes(t testing.TB, b []byte) ([]scanned, scanResult) {
	t.Helper()
	var out []scanned
	res, err := scanWAL(bytes.NewReader(b), int64(len(b)), func(r walRecord) error {
		out = append(out, scanned{off: r.off, seq: r.seq, data: string(r.data)})
		return nil
	})
	require.NoError(t, err)
	return out, res
}

func TestScanWAL(t *testing.T) {
	t.Parallel()
	r1, r2, r3 := encode(rec{1, "one"}), encode(rec{2, ""}), encode(rec{5, "five"})
	n1, n2 := int64(len(r1)), int64(len(r2))
	cat := func(parts ...[]byte) []byte { return bytes.Join(parts, nil) }
	flip := func(b []byte, i int) []byte { b = bytes.Clone(b); b[i] ^= 0x01; return b }

	tests := []struct {
		name     string
		in       []byte
		wantSeqs []uint64
		corrupt  []span
		tailOnly bool
	}{
		{"Empty", nil, nil, nil, false},
		{"Valid", cat(r1, r2, r3), []uint64{1, 2, 5}, nil, false},
		{"TornHeader", cat(r1, r2, r3[:5]), []uint64{1, 2}, []span{{n1 + n2, n1 + n2 + 5}}, true},
		{"TornData", cat(r1, r2, r3[:len(r3)-1]), []uint64{1, 2}, []span{{n1 + n2, n1 + n2 + int64(len(r3)) - 1}}, true},
		{"BadCRCInMiddle", cat(r1, flip(r2, 14), r3), []uint64{1, 5}, []span{{n1, n1 + n2}}, false},
		{"BadLengthInMiddle", cat(r1, flip(r2, 0), r3), []uint64{1, 5}, []span{{n1, n1 + n2}}, false},
		{"BadSeqInMiddle", cat(r1, flip(r2, 4), r3), []uint64{1, 5}, []span{{n1, n1 + n2}}, false},
		{"GarbageBetween", cat(r1, []byte("zzzz"), r3), []uint64{1, 5}, []span{{n1, n1 + 4}}, false},
		{"SeqNotIncreasing", cat(r1, r1), []uint64{1}, []span{{n1, 2 * n1}}, true},
		{"ZeroSeq", encode(rec{0, "x"}), nil, []span{{0, headerSize + 1}}, true},
		{"ZeroFilledTail", cat(r1, make([]byte, 40)), []uint64{1}, []span{{n1, n1 + 40}}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, res := scanBytes(t, tt.in)
			var seqs []uint64
			for _, g := range got {
				seqs = append(seqs, g.seq)
			}
			require.Equal(t, tt.wantSeqs, seqs)
			require.Equal(t, tt.corrupt, res.corrupt)
			require.Equal(t, tt.tailOnly, res.tailOnly())
			require.Equal(t, len(got), res.records)
		})
	}
}

// FuzzScanWAL: decoding arbitrary bytes never panics; every record returned
// is exactly the encoding found at its offset (so its CRC matches), seqs
// strictly increase, and records plus corrupt ranges tile the input.
func FuzzScanWAL(f *testing.F) {
	valid := encode(rec{1, `{"type":"system"}`}, rec{2, ""}, rec{3, `{"type":"result"}`})
	f.Add([]byte{})
	f.Add(valid)
	f.Add(valid[:len(valid)-3])
	f.Add(append([]byte("garbage"), valid...))
	mid := bytes.Clone(valid)
	mid[headerSize+2] ^= 0xff
	f.Add(mid)
	f.Add(make([]byte, 64))
	f.Fuzz(func(t *testing.T, in []byte) {
		got, res := scanBytes(t, in)
		pos := int64(0)
		ci := 0
		var last uint64
		for _, g := range got {
			for ci < len(res.corrupt) && res.corrupt[ci].from == pos {
				require.Greater(t, res.corrupt[ci].to, pos)
				pos = res.corrupt[ci].to
				ci++
			}
			require.Equal(t, pos, g.off, "records and corrupt ranges tile the input")
			enc := appendRecord(nil, g.seq, []byte(g.data))
			require.Equal(t, enc, in[g.off:g.off+int64(len(enc))], "record at %d is a valid encoding", g.off)
			require.Greater(t, g.seq, last)
			last = g.seq
			pos += int64(len(enc))
		}
		for ; ci < len(res.corrupt); ci++ {
			require.Equal(t, pos, res.corrupt[ci].from)
			pos = res.corrupt[ci].to
		}
		require.Equal(t, int64(len(in)), pos)
		if len(got) > 0 {
			require.Equal(t, got[len(got)-1].off+headerSize+int64(len(got[len(got)-1].data)), res.validEnd)
		}
		// Re-encoding the valid records decodes to the same records, cleanly.
		var clean []byte
		for _, g := range got {
			clean = appendRecord(clean, g.seq, []byte(g.data))
		}
		again, res2 := scanBytes(t, clean)
		require.Empty(t, res2.corrupt)
		require.Len(t, again, len(got))
	})
}
