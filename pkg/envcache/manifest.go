package envcache

import (
	"bufio"
	"fmt"
	"io/fs"
	"os"
	"strconv"
	"strings"
)

// manifestFile lists an entry's files; its last line seals it.
const manifestFile = "fleet-manifest"

// item is one path of an entry.
type item struct {
	kind byte // 'f' file, 'l' symbolic link, 'd' directory
	mode fs.FileMode
	size int64 // a file's size; a link's target length
	path string
}

func formatManifest(items []item) []byte {
	var b strings.Builder
	var total int64
	for _, it := range items {
		fmt.Fprintf(&b, "%c %o %d %s\n", it.kind, it.mode.Perm(), it.size, strconv.Quote(it.path))
		total += it.size
	}
	fmt.Fprintf(&b, "sealed %d %d\n", len(items), total)
	return []byte(b.String())
}

// readManifest reads and checks a manifest: every line well formed, the
// seal present and matching. It returns the items and their total size.
func readManifest(name string) ([]item, int64, error) {
	f, err := os.Open(name)
	if err != nil {
		return nil, 0, err
	}
	defer f.Close()
	return parseManifest(bufio.NewScanner(f))
}

func parseManifest(sc *bufio.Scanner) ([]item, int64, error) {
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	var items []item
	var total int64
	for sc.Scan() {
		line := sc.Text()
		if rest, ok := strings.CutPrefix(line, "sealed "); ok {
			var n int
			var t int64
			if _, err := fmt.Sscanf(rest, "%d %d", &n, &t); err != nil || n != len(items) || t != total || sc.Scan() {
				return nil, 0, fmt.Errorf("%w: the manifest's seal does not match it", ErrCorrupt)
			}
			return items, total, nil
		}
		it, err := parseItem(line)
		if err != nil {
			return nil, 0, err
		}
		items = append(items, it)
		total += it.size
	}
	return nil, 0, fmt.Errorf("%w: the manifest is not sealed", ErrCorrupt)
}

func parseItem(line string) (item, error) {
	bad := fmt.Errorf("%w: a manifest line is malformed: %q", ErrCorrupt, clip(line))
	parts := strings.SplitN(line, " ", 4)
	if len(parts) != 4 {
		return item{}, bad
	}
	switch parts[0] {
	case "f", "l", "d":
	default:
		return item{}, bad
	}
	mode, err := strconv.ParseUint(parts[1], 8, 32)
	if err != nil || mode > 0o777 {
		return item{}, bad
	}
	size, err := strconv.ParseInt(parts[2], 10, 64)
	if err != nil || size < 0 {
		return item{}, bad
	}
	p, err := strconv.Unquote(parts[3])
	if err != nil || checkRel(p, 4096) != nil {
		return item{}, bad
	}
	return item{kind: parts[0][0], mode: fs.FileMode(mode), size: size, path: p}, nil
}
