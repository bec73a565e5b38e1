package session

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/agentfleet/agentfleet/pkg/protocol"
	"github.com/agentfleet/agentfleet/pkg/sandbox"
	"github.com/agentfleet/agentfleet/pkg/storage"
)

// Checkpoint is what a session (or a one-shot run, for options.resume)
// leaves in storage after a turn, under queries/<tenant>/<id>/session/:
//
//	state.json            this struct
//	<claude sid>.tar      Claude Code's files of the session (SessionFiles):
//	                      <sid>.jsonl, the transcript, and <sid>/, the
//	                      session's directory (subagents' transcripts)
//	<claude sid>.jsonl    the transcript alone (checkpoints stored before
//	                      the archive; still restored)
//
// and, so that options.resume can name the Claude session id too,
// queries/<tenant>/_claude/<claude sid>.json holds the query id. Lookups stay
// inside one tenant's prefix, so a tenant can never resume another's.
type Checkpoint struct {
	V int `json:"v"`
	// Job is the session's job as submitted (a continuation runs it again).
	Job *protocol.Job `json:"job"`
	// JobSeq is the FLEET_JOBS sequence of the submission that started the
	// session; QueuedAt is when it was stored.
	JobSeq   uint64    `json:"job_seq"`
	QueuedAt time.Time `json:"queued_at"`
	// ClaudeSessionID names the transcript (--resume).
	ClaudeSessionID string `json:"claude_session_id"`
	// PromptApplied: the job's prompt ran as the first turn.
	PromptApplied bool `json:"prompt_applied"`
	// InputSeq is the FLEET_QUERIES sequence of the last .ctl input whose
	// turn ended (0: none yet).
	InputSeq uint64 `json:"input_seq"`
	// Turn counts the turns that ended.
	Turn int       `json:"turn"`
	At   time.Time `json:"at"`
	// Files names the session's files archive next to state.json ("":
	// the checkpoint holds <sid>.jsonl only); FilesBytes is its size.
	Files      string `json:"files,omitempty"`
	FilesBytes int64  `json:"files_bytes,omitempty"`
}

// Key helpers for the checkpoint layout.
func stateKey(tenant, id string) string {
	return storage.QueryPrefix(tenant, id) + "session/state.json"
}

func transcriptKey(tenant, id, sid string) string {
	return storage.QueryPrefix(tenant, id) + "session/" + sid + ".jsonl"
}

func filesKey(tenant, id, name string) string {
	return storage.QueryPrefix(tenant, id) + "session/" + name
}

func claudeIndexKey(tenant, sid string) string {
	return "queries/" + tenant + "/_claude/" + sid + ".json"
}

// ErrNoCheckpoint: the query has no checkpoint.
var ErrNoCheckpoint = errors.New("session: no checkpoint")

// Save reads the files of session cp.ClaudeSessionID out of sb (at most
// DefaultMaxFilesBytes) and stores them with cp for tenant/id; it returns
// the state's key.
func Save(ctx context.Context, store storage.Store, sb sandbox.Sandbox, tenant, id string, cp Checkpoint) (string, error) {
	return SaveMax(ctx, store, sb, tenant, id, cp, DefaultMaxFilesBytes)
}

// SaveMax is Save with a limit on the session's files: over max bytes it
// stores nothing and returns an error wrapping ErrTooLarge. The files are
// written before the state that names them.
func SaveMax(ctx context.Context, store storage.Store, sb sandbox.Sandbox, tenant, id string, cp Checkpoint, max int64) (string, error) {
	archive, err := SessionFiles(ctx, sb, cp.ClaudeSessionID, max)
	if err != nil {
		return "", err
	}
	cp.Files, cp.FilesBytes = cp.ClaudeSessionID+".tar", int64(len(archive))
	if err := store.Put(ctx, filesKey(tenant, id, cp.Files), archive); err != nil {
		return "", fmt.Errorf("session: store the session's files: %w", err)
	}
	cp.V = 1
	if cp.At.IsZero() {
		cp.At = time.Now().UTC()
	}
	b, err := json.Marshal(cp)
	if err != nil {
		return "", err
	}
	key := stateKey(tenant, id)
	if err := store.Put(ctx, key, b); err != nil {
		return "", fmt.Errorf("session: store checkpoint: %w", err)
	}
	idx, _ := json.Marshal(map[string]string{"id": id})
	if err := store.Put(ctx, claudeIndexKey(tenant, cp.ClaudeSessionID), idx); err != nil {
		return "", fmt.Errorf("session: store session index: %w", err)
	}
	return key, nil
}

// Load returns tenant/id's checkpoint (ErrNoCheckpoint when there is none).
func Load(ctx context.Context, store storage.Store, tenant, id string) (*Checkpoint, error) {
	b, err := store.Get(ctx, stateKey(tenant, id))
	if errors.Is(err, storage.ErrNotFound) {
		return nil, fmt.Errorf("%w for %s/%s", ErrNoCheckpoint, tenant, id)
	}
	if err != nil {
		return nil, err
	}
	var cp Checkpoint
	if err := json.Unmarshal(b, &cp); err != nil {
		return nil, fmt.Errorf("session: checkpoint of %s/%s does not decode: %w", tenant, id, err)
	}
	if !sessionIDRE.MatchString(cp.ClaudeSessionID) {
		return nil, fmt.Errorf("session: checkpoint of %s/%s names no valid session id", tenant, id)
	}
	return &cp, nil
}

// Find resolves options.resume within tenant: an earlier query id with a
// checkpoint, or a Claude session id one of tenant's queries recorded. It
// returns the checkpoint and the query id it belongs to, or
// ErrNoCheckpoint (also for another tenant's ids: lookups never leave the
// tenant's prefix).
func Find(ctx context.Context, store storage.Store, tenant, ref string) (*Checkpoint, string, error) {
	if protocol.ValidID(ref) {
		cp, err := Load(ctx, store, tenant, ref)
		if err == nil {
			return cp, ref, nil
		}
		if !errors.Is(err, ErrNoCheckpoint) {
			return nil, "", err
		}
	}
	if !sessionIDRE.MatchString(ref) {
		return nil, "", fmt.Errorf("%w: %q", ErrNoCheckpoint, ref)
	}
	b, err := store.Get(ctx, claudeIndexKey(tenant, ref))
	if errors.Is(err, storage.ErrNotFound) {
		return nil, "", fmt.Errorf("%w: no query of tenant %s recorded session %s", ErrNoCheckpoint, tenant, ref)
	}
	if err != nil {
		return nil, "", err
	}
	var idx struct {
		ID string `json:"id"`
	}
	if json.Unmarshal(b, &idx) != nil || !protocol.ValidID(idx.ID) {
		return nil, "", fmt.Errorf("session: bad session index entry for %s", ref)
	}
	cp, err := Load(ctx, store, tenant, idx.ID)
	if err != nil {
		return nil, "", err
	}
	return cp, idx.ID, nil
}

// RestoreCheckpoint writes cp's session files (stored for tenant/id) into
// sb, replacing any copy of the session there, so --resume=
// cp.ClaudeSessionID continues from exactly this checkpoint.
func RestoreCheckpoint(ctx context.Context, store storage.Store, sb sandbox.Sandbox, tenant, id string, cp *Checkpoint) error {
	if cp.Files == "" {
		data, err := store.Get(ctx, transcriptKey(tenant, id, cp.ClaudeSessionID))
		if err != nil {
			return fmt.Errorf("session: load transcript of %s/%s: %w", tenant, id, err)
		}
		return Restore(ctx, sb, cp.ClaudeSessionID, data)
	}
	if cp.Files != cp.ClaudeSessionID+".tar" {
		return fmt.Errorf("session: checkpoint of %s/%s names files %q, not its session's", tenant, id, cp.Files)
	}
	archive, err := store.Get(ctx, filesKey(tenant, id, cp.Files))
	if err != nil {
		return fmt.Errorf("session: load the session's files of %s/%s: %w", tenant, id, err)
	}
	// Whatever limit stored it, an archive is restored whole (CheckFiles
	// still vets its entries).
	return RestoreFiles(ctx, sb, cp.ClaudeSessionID, archive, max(int64(len(archive)), DefaultMaxFilesBytes))
}
