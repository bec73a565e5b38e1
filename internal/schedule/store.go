package schedule

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/internal/provision"
	"github.com/agentfleet/agentfleet/pkg/protocol"
)

// nats-server's message-schedule headers.
const (
	hdrSchedule       = "Nats-Schedule"
	hdrScheduleTarget = "Nats-Schedule-Target"
	hdrScheduleTZ     = "Nats-Schedule-Time-Zone"
	hdrScheduleNext   = "Nats-Schedule-Next"
	hdrRollup         = "Nats-Rollup"
)

// Errors of the Store; the API answers them with their codes.
var (
	ErrNotFound = errors.New("no such schedule")
	ErrExists   = errors.New("a schedule of that name exists")
)

// Definition is a schedule as stored: the body of its message.
type Definition struct {
	V       int                   `json:"v"`
	Name    string                `json:"name"`
	Tenant  string                `json:"tenant"`
	Spec    protocol.ScheduleSpec `json:"spec"`
	Job     protocol.Job          `json:"job"`
	Paused  bool                  `json:"paused,omitempty"`
	Created time.Time             `json:"created"`
}

// Store keeps schedules in the stream <PREFIX>_SCHEDULES.
type Store struct {
	js       jetstream.JetStream
	names    protocol.Names
	replicas int
}

// NewStore returns a Store on js; replicas is the stream's (0 = 1).
func NewStore(js jetstream.JetStream, names protocol.Names, replicas int) *Store {
	return &Store{js: js, names: names, replicas: max(replicas, 1)}
}

// Ensure creates or updates the stream.
func (s *Store) Ensure(ctx context.Context) error {
	p := s.names.Prefix()
	cfg := jetstream.StreamConfig{
		Name:              s.names.SchedulesStream(),
		Description:       "agentfleet schedules: one definition and the latest firing per schedule",
		Subjects:          []string{p + ".sched.*.*", p + ".fire.*.*"},
		Storage:           jetstream.FileStorage,
		Replicas:          s.replicas,
		MaxMsgsPerSubject: 1,
		AllowRollup:       true,
		AllowMsgSchedules: true,
		Discard:           jetstream.DiscardOld,
	}
	return provision.Retry(ctx, func(ctx context.Context) error {
		_, err := s.js.CreateOrUpdateStream(ctx, cfg)
		if err != nil {
			return fmt.Errorf("schedule: the %s stream: %w", cfg.Name, err)
		}
		return nil
	})
}

// Add stores def (new: a name in use is ErrExists) and, unless paused,
// arms it.
func (s *Store) Add(ctx context.Context, def Definition) error {
	c, err := Compile(def.Spec, time.Now())
	if err != nil {
		return err
	}
	def.V = 1
	return s.put(ctx, def, c, 0)
}

// put writes def as the schedule's only message, expecting lastSeq as its
// subject's last sequence (0: none).
func (s *Store) put(ctx context.Context, def Definition, c Compiled, lastSeq uint64) error {
	body, err := json.Marshal(def)
	if err != nil {
		return err
	}
	m := nats.NewMsg(s.names.ScheduleSubject(def.Tenant, def.Name))
	m.Data = body
	m.Header.Set(hdrRollup, "sub")
	if !def.Paused {
		m.Header.Set(hdrSchedule, c.Pattern)
		m.Header.Set(hdrScheduleTarget, s.names.ScheduleFireSubject(def.Tenant, def.Name))
		if c.TZ != "" {
			m.Header.Set(hdrScheduleTZ, c.TZ)
		}
	}
	_, err = s.js.PublishMsg(ctx, m, jetstream.WithExpectLastSequencePerSubject(lastSeq))
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence {
		if lastSeq == 0 {
			return fmt.Errorf("%w: %s (remove it first)", ErrExists, def.Name)
		}
		return fmt.Errorf("schedule %s changed meanwhile; try again", def.Name)
	}
	if err != nil {
		return fmt.Errorf("storing schedule %s: %w", def.Name, err)
	}
	return nil
}

// Get returns the schedule's definition and its message's sequence and
// time.
func (s *Store) Get(ctx context.Context, tenant, name string) (Definition, *jetstream.RawStreamMsg, error) {
	var def Definition
	msg, err := s.last(ctx, s.names.ScheduleSubject(tenant, name))
	if err != nil {
		return def, nil, err
	}
	if msg == nil {
		return def, nil, fmt.Errorf("%w: %s", ErrNotFound, name)
	}
	if err := json.Unmarshal(msg.Data, &def); err != nil {
		return def, nil, fmt.Errorf("schedule %s: a stored definition that does not decode: %w", name, err)
	}
	return def, msg, nil
}

// last is the last message on subject, nil when none.
func (s *Store) last(ctx context.Context, subject string) (*jetstream.RawStreamMsg, error) {
	st, err := s.js.Stream(ctx, s.names.SchedulesStream())
	if err != nil {
		return nil, err
	}
	msg, err := st.GetLastMsgForSubject(ctx, subject)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil, nil
	}
	return msg, err
}

// SetPaused pauses or resumes the schedule: a paused one keeps its
// definition and never fires; resuming re-arms it from now.
func (s *Store) SetPaused(ctx context.Context, tenant, name string, paused bool) error {
	def, msg, err := s.Get(ctx, tenant, name)
	if err != nil {
		return err
	}
	if def.Paused == paused {
		return nil
	}
	c, err := Compile(def.Spec, time.Now())
	if err != nil {
		return fmt.Errorf("schedule %s cannot be resumed: %w", name, err)
	}
	def.Paused = paused
	return s.put(ctx, def, c, msg.Sequence)
}

// Remove deletes the schedule and its latest firing.
func (s *Store) Remove(ctx context.Context, tenant, name string) error {
	if _, _, err := s.Get(ctx, tenant, name); err != nil {
		return err
	}
	st, err := s.js.Stream(ctx, s.names.SchedulesStream())
	if err != nil {
		return err
	}
	for _, subj := range []string{s.names.ScheduleSubject(tenant, name), s.names.ScheduleFireSubject(tenant, name)} {
		if err := st.Purge(ctx, jetstream.WithPurgeSubject(subj)); err != nil {
			return fmt.Errorf("removing schedule %s: %w", name, err)
		}
	}
	return nil
}

// Entry is a schedule as listed: its definition, when it was stored, and
// its latest firing (nil when none).
type Entry struct {
	Def    Definition
	Stored time.Time
	Fired  *jetstream.RawStreamMsg
}

// Info is the entry as the API shows it; state is the latest job's state
// when known.
func (e Entry) Info(now time.Time, state protocol.State) protocol.ScheduleInfo {
	in := protocol.ScheduleInfo{Name: e.Def.Name, Tenant: e.Def.Tenant, When: e.Def.Spec, Paused: e.Def.Paused,
		Created: e.Def.Created, Prompt: protocol.PromptPreview(e.Def.Job.Prompt), LastState: state}
	c, err := Compile(e.Def.Spec, e.Stored.Add(-time.Second))
	in.Spec = c.String()
	if err != nil {
		in.Spec = fmt.Sprintf("%+v", e.Def.Spec)
	}
	if e.Fired != nil {
		in.LastJob = protocol.ScheduleJobID(e.Def.Name, e.Fired.Time)
	}
	if e.Def.Paused || err != nil {
		return in
	}
	if e.Fired != nil && e.Fired.Time.After(e.Stored) {
		if n, perr := time.Parse(time.RFC3339Nano, e.Fired.Header.Get(hdrScheduleNext)); perr == nil && n.After(now) {
			in.Next = &n
			return in
		}
	}
	if n, ok := c.Next(e.Stored, now); ok {
		in.Next = &n
	}
	return in
}

// List returns tenant's schedules ("" for every tenant's), by tenant and
// name.
func (s *Store) List(ctx context.Context, tenant string) ([]Entry, error) {
	st, err := s.js.Stream(ctx, s.names.SchedulesStream())
	if err != nil {
		return nil, err
	}
	filter := s.names.Prefix() + ".sched." + tenant + ".*"
	if tenant == "" {
		filter = s.names.Prefix() + ".sched.*.*"
	}
	info, err := st.Info(ctx, jetstream.WithSubjectFilter(filter))
	if err != nil {
		return nil, err
	}
	subjects := make([]string, 0, len(info.State.Subjects))
	for subj := range info.State.Subjects {
		subjects = append(subjects, subj)
	}
	sort.Strings(subjects)
	out := make([]Entry, 0, len(subjects))
	for _, subj := range subjects {
		parts := strings.Split(subj, ".")
		t, name := parts[len(parts)-2], parts[len(parts)-1]
		def, msg, err := s.Get(ctx, t, name)
		if errors.Is(err, ErrNotFound) {
			continue // removed meanwhile
		}
		if err != nil {
			return nil, err
		}
		fired, err := s.last(ctx, s.names.ScheduleFireSubject(t, name))
		if err != nil {
			return nil, err
		}
		out = append(out, Entry{Def: def, Stored: msg.Time, Fired: fired})
	}
	return out, nil
}
