package protocol

import (
	"fmt"
	"net/url"
	"regexp"
	"strings"
)

// Workspace limits and defaults (docs/workspaces.md).
const (
	// DefaultWorkspaceDepth is the clone depth of a workspace without depth.
	DefaultWorkspaceDepth = 50
	// MaxWorkspaceDepth is the largest workspace.depth.
	MaxWorkspaceDepth = 1_000_000
	// MaxRepoBytes is the longest workspace.repo.
	MaxRepoBytes = 2048
	// MaxRefBytes is the longest workspace.ref and workspace.branch.
	MaxRefBytes = 255
	// MaxArtifactFiles is how many files an Artifact lists at most.
	MaxArtifactFiles = 1000
)

// CodeWorkspaceCheckout is the error code of a job whose repository or ref
// does not exist, cannot be read with the worker's credentials, or is larger
// than the worker allows. Never retried.
const CodeWorkspaceCheckout = "workspace_checkout"

// ReasonWorkspaceCheckout is the synthetic result reason of a job whose
// workspace could not be checked out (the agent never started).
const ReasonWorkspaceCheckout = "workspace_checkout"

// Workspace is a job's optional git repository (docs/workspaces.md): the agent runs in a
// checkout of Repo at Ref, and its work comes back as a diff and a bundle.
type Workspace struct {
	// Repo is the remote: https://…, http://…, ssh://…, git@host:path or
	// file:///… (file only where the worker allows it). It never carries
	// credentials: those are the worker's.
	Repo string `json:"repo" msgpack:"repo"`
	// Ref is the branch, tag or full commit to check out ("" = the remote's HEAD).
	Ref string `json:"ref,omitempty" msgpack:"ref,omitempty"`
	// Depth is the clone depth; nil = DefaultWorkspaceDepth, 0 = full history.
	Depth *int `json:"depth,omitempty" msgpack:"depth,omitempty"`
	// Branch is the branch the work ends on ("" = fleet/<tenant>/<id>).
	Branch string `json:"branch,omitempty" msgpack:"branch,omitempty"`
	// Push pushes Branch to Repo when the run ends.
	Push bool `json:"push,omitempty" msgpack:"push,omitempty"`
	// Token is a short-lived credential the fleet itself minted for Repo
	// (a GitHub App's installation token): the worker sends it as the
	// password of user x-access-token to Repo's host, for this job's
	// fetch and push only, never to the agent. Only the dispatcher sets it
	// (on the jobs it starts from GitHub events); a submitted job carrying
	// one is refused (RefuseToken).
	Token string `json:"token,omitempty" msgpack:"token,omitempty"`
}

// RefuseToken returns an error when job carries a workspace token: only
// the fleet's own paths (GitHub events) may set one.
func RefuseToken(job *Job) error {
	if job != nil && job.Workspace != nil && job.Workspace.Token != "" {
		return invalid("workspace.token", "is set by the fleet only (on jobs started by GitHub events); leave it out")
	}
	return nil
}

// RefuseFleetOnly refuses a submitted job that carries a field only the
// fleet sets on the jobs it starts itself: trigger (schedules, triggers,
// GitHub) and workspace.token.
func RefuseFleetOnly(job *Job) error {
	if job != nil && job.Trigger != nil {
		return invalid("trigger", "is set by the fleet on the jobs it starts (schedules, triggers, GitHub); leave it out")
	}
	return RefuseToken(job)
}

// CloneDepth is Depth with its default applied.
func (w *Workspace) CloneDepth() int {
	if w.Depth == nil {
		return DefaultWorkspaceDepth
	}
	return *w.Depth
}

// WorkBranch is Branch with its default, fleet/<tenant>/<id>, applied.
func (w *Workspace) WorkBranch(tenant, id string) string {
	if w.Branch != "" {
		return w.Branch
	}
	return "fleet/" + tenant + "/" + id
}

// WorkspaceStatus is the "workspace" object of status events: StartSHA in
// "running", the capture's summary in the terminal status.
type WorkspaceStatus struct {
	StartSHA     string `json:"start_sha,omitempty" msgpack:"start_sha,omitempty"`
	EndSHA       string `json:"end_sha,omitempty" msgpack:"end_sha,omitempty"`
	Branch       string `json:"branch,omitempty" msgpack:"branch,omitempty"`
	FilesChanged int    `json:"files_changed,omitempty" msgpack:"files_changed,omitempty"`
	Additions    int    `json:"additions,omitempty" msgpack:"additions,omitempty"`
	Deletions    int    `json:"deletions,omitempty" msgpack:"deletions,omitempty"`
	Pushed       bool   `json:"pushed,omitempty" msgpack:"pushed,omitempty"`
	PushError    string `json:"push_error,omitempty" msgpack:"push_error,omitempty"`
	// CaptureError says why the work could not be captured (the run's
	// outcome is kept; nothing was stored).
	CaptureError string `json:"capture_error,omitempty" msgpack:"capture_error,omitempty"`
	// Checkpoint marks the work of a parked session: as of its last
	// checkpoint, not final (the session goes on).
	Checkpoint bool `json:"checkpoint,omitempty" msgpack:"checkpoint,omitempty"`
	// Cache says how the worker's repository cache served the checkout
	// (docs/warm.md): "tree" (a prepared working tree), "hit", "miss" (the
	// mirror fetched what was new) or "cold" (the cache could not serve
	// it; CacheCold says why). Set on
	// "running"; empty without a cache.
	Cache     string `json:"cache,omitempty" msgpack:"cache,omitempty"`
	CacheCold string `json:"cache_cold,omitempty" msgpack:"cache_cold,omitempty"`
}

// File statuses of ArtifactFile.Status.
const (
	FileAdded       = "added"
	FileModified    = "modified"
	FileDeleted     = "deleted"
	FileRenamed     = "renamed"
	FileTypeChanged = "type_changed"
)

// ArtifactFile is one changed file of an Artifact.
type ArtifactFile struct {
	Path      string `json:"path" msgpack:"path"`
	OldPath   string `json:"old_path,omitempty" msgpack:"old_path,omitempty"`
	Status    string `json:"status" msgpack:"status"`
	Additions int    `json:"additions" msgpack:"additions"`
	Deletions int    `json:"deletions" msgpack:"deletions"`
	Binary    bool   `json:"binary" msgpack:"binary"`
}

// Artifact is the manifest of a run's captured work, published once on
// <prefix>.query.<tenant>.<id>.artifact (docs/workspaces.md).
type Artifact struct {
	StartSHA    string         `json:"start_sha" msgpack:"start_sha"`
	EndSHA      string         `json:"end_sha" msgpack:"end_sha"`
	Branch      string         `json:"branch" msgpack:"branch"`
	Pushed      bool           `json:"pushed" msgpack:"pushed"`
	PushError   string         `json:"push_error,omitempty" msgpack:"push_error,omitempty"`
	Files       []ArtifactFile `json:"files" msgpack:"files"`
	FilesTotal  int            `json:"files_total" msgpack:"files_total"`
	Truncated   bool           `json:"truncated" msgpack:"truncated"`
	DiffKey     string         `json:"diff_key" msgpack:"diff_key"`
	DiffBytes   int64          `json:"diff_bytes" msgpack:"diff_bytes"`
	BundleKey   string         `json:"bundle_key" msgpack:"bundle_key"`
	BundleBytes int64          `json:"bundle_bytes" msgpack:"bundle_bytes"`
	// Additions and Deletions total the text lines of every file, listed or not.
	Additions int `json:"additions" msgpack:"additions"`
	Deletions int `json:"deletions" msgpack:"deletions"`
	// Checkpoint marks the capture of a parked session: its work as of
	// its last checkpoint; the session's end publishes the final one.
	Checkpoint bool `json:"checkpoint,omitempty" msgpack:"checkpoint,omitempty"`
}

// Summary is the terminal status's view of a.
func (a *Artifact) Summary() *WorkspaceStatus {
	return &WorkspaceStatus{
		StartSHA: a.StartSHA, EndSHA: a.EndSHA, Branch: a.Branch, FilesChanged: a.FilesTotal,
		Additions: a.Additions, Deletions: a.Deletions, Pushed: a.Pushed, PushError: a.PushError,
		Checkpoint: a.Checkpoint,
	}
}

var (
	// refRE is a conservative git ref name: no leading '-', '.' or '/'.
	refRE = regexp.MustCompile(`^[A-Za-z0-9_+][A-Za-z0-9._/+-]*$`)
	// scpRE is git's scp-like syntax, user@host:path.
	scpRE = regexp.MustCompile(`^[A-Za-z0-9._-]+@[A-Za-z0-9.-]+:[A-Za-z0-9~._/+-][A-Za-z0-9~._/+@-]*$`)
)

func (w *Workspace) validate() error {
	if w == nil {
		return nil
	}
	if err := checkText("workspace.repo", w.Repo, MaxRepoBytes); err != nil {
		return err
	}
	if err := ValidRepo(w.Repo); err != nil {
		return invalid("workspace.repo", err.Error())
	}
	if w.Token != "" && (len(w.Token) > 1024 || strings.ContainsAny(w.Token, " \t\r\n:@/") || !strings.HasPrefix(w.Repo, "https://") && !strings.HasPrefix(w.Repo, "http://")) {
		return invalid("workspace.token", "must be a short token on an http(s) repo")
	}
	if w.Ref != "" {
		if err := validRef(w.Ref); err != nil {
			return invalid("workspace.ref", err.Error())
		}
	}
	if w.Depth != nil && (*w.Depth < 0 || *w.Depth > MaxWorkspaceDepth) {
		return invalid("workspace.depth", fmt.Sprintf("must be between 0 (full history) and %d, got %d", MaxWorkspaceDepth, *w.Depth))
	}
	if w.Branch != "" {
		if err := validRef(w.Branch); err != nil {
			return invalid("workspace.branch", err.Error())
		}
		if w.Branch == "HEAD" || strings.HasPrefix(w.Branch, "refs/") {
			return invalid("workspace.branch", fmt.Sprintf("must be a branch name (not HEAD or refs/…), got %s", quoteShort(w.Branch)))
		}
	}
	return nil
}

// ValidRepo checks a workspace.repo value: one of the remote forms of
// docs/workspaces.md, no credentials in it, nothing git could read as an option.
func ValidRepo(repo string) error {
	for _, r := range repo {
		if r <= ' ' || r == 0x7f {
			return fmt.Errorf("must not contain spaces or control characters, got %s", quoteShort(RedactRepo(repo)))
		}
	}
	if scpRE.MatchString(repo) && !strings.Contains(repo, "://") {
		return nil
	}
	u, err := url.Parse(repo)
	if err != nil {
		return fmt.Errorf("is not a URL or user@host:path: %s", quoteShort(repo))
	}
	switch u.Scheme {
	case "https", "http", "ssh":
		if u.Host == "" || strings.HasPrefix(u.Host, "-") {
			return fmt.Errorf("must name a host, got %s", quoteShort(repo))
		}
		if _, hasPass := u.User.Password(); hasPass || u.User != nil && u.Scheme != "ssh" {
			return fmt.Errorf("must not carry credentials (the worker's --git-credentials are used): %s", quoteShort(RedactRepo(repo)))
		}
	case "file":
		if u.Host != "" && u.Host != "localhost" || !strings.HasPrefix(u.Path, "/") {
			return fmt.Errorf("file remotes must be file:///absolute/path, got %s", quoteShort(repo))
		}
	default:
		return fmt.Errorf("must be https://, http://, ssh://, file:/// or user@host:path, got %s", quoteShort(repo))
	}
	if u.RawQuery != "" || u.Fragment != "" {
		return fmt.Errorf("must not have a query or fragment, got %s", quoteShort(RedactRepo(repo)))
	}
	return nil
}

// RedactRepo is repo with any user info of a URL replaced by "xxxxx", for
// messages and logs.
func RedactRepo(repo string) string {
	scheme, rest, ok := strings.Cut(repo, "://")
	if !ok {
		return repo
	}
	host, path, _ := strings.Cut(rest, "/")
	if i := strings.LastIndexByte(host, '@'); i >= 0 {
		host = "xxxxx@" + host[i+1:]
	}
	if path != "" || strings.Contains(rest, "/") {
		return scheme + "://" + host + "/" + path
	}
	return scheme + "://" + host
}

func validRef(ref string) error {
	switch {
	case len(ref) > MaxRefBytes:
		return fmt.Errorf("is %d bytes, at most %d allowed", len(ref), MaxRefBytes)
	case !refRE.MatchString(ref):
		return fmt.Errorf("must be a branch, tag or commit (letters, digits, . _ / + -, not starting with - . or /), got %s", quoteShort(ref))
	case strings.Contains(ref, ".."), strings.Contains(ref, "//"), strings.Contains(ref, "/."),
		strings.HasSuffix(ref, "/"), strings.HasSuffix(ref, "."), strings.HasSuffix(ref, ".lock"):
		return fmt.Errorf("is not a valid git ref name, got %s", quoteShort(ref))
	}
	return nil
}
