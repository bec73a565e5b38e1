package workspace

import (
	"bufio"
	"bytes"
	"encoding/base64"
	"fmt"
	"net/url"
	"os"
	"strings"
)

// Credentials are the worker's git credentials for http(s) remotes, read
// from a file in git's credential-store format: one URL per line,
//
//	https://<user>:<password or token>@<host>[:<port>][/<path>]
//
// with user and password percent-encoded. A repository uses the entry with
// the same scheme and host whose path is the longest prefix of its own path.
// The zero value holds none. Its String never shows a secret.
type Credentials struct {
	entries []credential
}

type credential struct {
	scheme, host, path string
	user, password     string
}

// String names the hosts, never the secrets.
func (c Credentials) String() string {
	hosts := make([]string, len(c.entries))
	for i, e := range c.entries {
		hosts[i] = e.scheme + "://" + e.host + e.path
	}
	return "git credentials for " + strings.Join(hosts, ", ")
}

// Len is the number of entries.
func (c Credentials) Len() int { return len(c.entries) }

// LoadCredentials reads a credential-store file.
func LoadCredentials(path string) (Credentials, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return Credentials{}, fmt.Errorf("workspace: reading git credentials: %w", err)
	}
	return ParseCredentials(b)
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
	u, err := url.Parse(rawURL)
	if err != nil || (u.Scheme != "https" && u.Scheme != "http") {
		return credential{}, false
	}
	host := strings.ToLower(u.Host)
	best := -1
	for i, e := range c.entries {
		if e.scheme != u.Scheme || e.host != host {
			continue
		}
		if e.path != "" && u.Path != e.path && !strings.HasPrefix(u.Path, e.path+"/") {
			continue
		}
		if best < 0 || len(e.path) > len(c.entries[best].path) {
			best = i
		}
	}
	if best < 0 {
		return credential{}, false
	}
	return c.entries[best], true
}
