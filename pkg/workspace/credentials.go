package workspace

import (
	"bufio"
	"bytes"
	"encoding/base64"
	"fmt"
	"net/url"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/agentfleet/agentfleet/pkg/protocol"
)

// Credentials are the worker's git credentials for http(s) remotes, read
// from a file in git's credential-store format: one URL per line,
//
//	https://<user>:<password or token>@<host>[:<port>][/<path>]
//
// with user and password percent-encoded. A repository uses the entry with
// the same scheme and host whose path is the longest prefix of its own path.
// The zero value holds none. Its String never shows a secret.
//
// Credentials loaded from a file follow it: each use looks at the file
// and reads it again when it changed (rotated credentials need no
// restart). A file that cannot be read or parsed any more keeps the last
// good entries, and the failure is said where they are refused.
type Credentials struct {
	entries []credential
	file    *credFile
}

// credFile is a credential-store file and what was last read from it.
type credFile struct {
	path    string
	mu      sync.Mutex
	stamp   fileStamp
	entries []credential
	err     error // the last reading's failure; entries are the last good ones
}

// fileStamp tells one version of a file from another.
type fileStamp struct {
	mod  time.Time
	size int64
	ino  uint64
}

type credential struct {
	scheme, host, path string
	user, password     string
}

// String names the hosts, never the secrets.
func (c Credentials) String() string {
	entries, _ := c.current()
	hosts := make([]string, len(entries))
	for i, e := range entries {
		hosts[i] = e.scheme + "://" + e.host + e.path
	}
	return "git credentials for " + strings.Join(hosts, ", ")
}

// Len is the number of entries.
func (c Credentials) Len() int {
	entries, _ := c.current()
	return len(entries)
}

// LoadCredentials reads a credential-store file; the Credentials returned
// read it again whenever it changes.
func LoadCredentials(path string) (Credentials, error) {
	f := &credFile{path: path}
	if err := f.reload(); err != nil {
		return Credentials{}, err
	}
	return Credentials{file: f}, nil
}

// current returns the entries in force, and why the file could not be read
// again if it could not (the entries are then the last good ones).
func (c Credentials) current() ([]credential, error) {
	if c.file == nil {
		return c.entries, nil
	}
	c.file.mu.Lock()
	defer c.file.mu.Unlock()
	if err := c.file.reload(); err != nil {
		c.file.err = err
	} else {
		c.file.err = nil
	}
	return c.file.entries, c.file.err
}

// reload reads the file when its stamp changed since the last good read.
// Callers hold mu (LoadCredentials needs none: the file is not shared yet).
func (f *credFile) reload() error {
	fi, err := os.Stat(f.path)
	if err != nil {
		return fmt.Errorf("workspace: reading git credentials: %w", err)
	}
	stamp := stampOf(fi)
	if f.entries != nil && stamp == f.stamp {
		return nil
	}
	b, err := os.ReadFile(f.path)
	if err != nil {
		return fmt.Errorf("workspace: reading git credentials: %w", err)
	}
	c, err := ParseCredentials(b)
	if err != nil {
		return err
	}
	f.entries, f.stamp = c.entries, stamp
	if f.entries == nil {
		f.entries = []credential{}
	}
	return nil
}

// ParseCredentials parses credential-store lines. Blank lines and lines
// starting with '#' are skipped. An error names the line, never its content.
func ParseCredentials(data []byte) (Credentials, error) {
	var c Credentials
	sc := bufio.NewScanner(bytes.NewReader(data))
	n := 0
	for sc.Scan() {
		n++
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		u, err := url.Parse(line)
		if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" || u.User == nil {
			return Credentials{}, fmt.Errorf("workspace: git credentials line %d: want http(s)://user:password@host[/path]", n)
		}
		pw, ok := u.User.Password()
		if !ok {
			return Credentials{}, fmt.Errorf("workspace: git credentials line %d: no password", n)
		}
		c.entries = append(c.entries, credential{
			scheme: u.Scheme, host: strings.ToLower(u.Host), path: strings.TrimSuffix(u.Path, "/"),
			user: u.User.Username(), password: pw,
		})
	}
	if err := sc.Err(); err != nil {
		return Credentials{}, fmt.Errorf("workspace: reading git credentials: %w", err)
	}
	return c, nil
}

// forRepo returns the git config key and value that authenticate requests to
// repo (an http.<url>.extraHeader scoped to the credential's host), or ok
// false when no entry matches.
func (c Credentials) forRepo(repo string) (key, value string, ok bool) {
	e, ok := c.match(repo)
	if !ok {
		return "", "", false
	}
	return "http." + e.scheme + "://" + e.host + e.path + "/.extraHeader", "Authorization: " + e.authorization(), true
}

// Authorization returns the value of the Authorization header for a request
// to rawURL (Basic auth of the best matching entry), or ok false. Egress
// proxies that add credentials outside the sandbox use it.
func (c Credentials) Authorization(rawURL string) (string, bool) {
	e, ok := c.match(rawURL)
	if !ok {
		return "", false
	}
	return e.authorization(), true
}

func (e credential) authorization() string {
	return "Basic " + base64.StdEncoding.EncodeToString([]byte(e.user+":"+e.password))
}

func (c Credentials) match(rawURL string) (credential, bool) {
	entries, _ := c.current()
	u, err := url.Parse(rawURL)
	if err != nil || (u.Scheme != "https" && u.Scheme != "http") {
		return credential{}, false
	}
	host := strings.ToLower(u.Host)
	best := -1
	for i, e := range entries {
		if e.scheme != u.Scheme || e.host != host {
			continue
		}
		if e.path != "" && u.Path != e.path && !strings.HasPrefix(u.Path, e.path+"/") {
			continue
		}
		if best < 0 || len(e.path) > len(entries[best].path) {
			best = i
		}
	}
	if best < 0 {
		return credential{}, false
	}
	return entries[best], true
}

// tokenAuth is the http.<url>.extraHeader entry for a job's own token
// (ws.Token: Basic auth of x-access-token and the token), scoped to the
// repository's scheme and host; ok false without a token or an http(s)
// repository.
func tokenAuth(ws protocol.Workspace) (key, value string, ok bool) {
	if ws.Token == "" {
		return "", "", false
	}
	u, err := url.Parse(ws.Repo)
	if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" {
		return "", "", false
	}
	e := credential{user: "x-access-token", password: ws.Token}
	return "http." + u.Scheme + "://" + strings.ToLower(u.Host) + "/.extraHeader", "Authorization: " + e.authorization(), true
}
