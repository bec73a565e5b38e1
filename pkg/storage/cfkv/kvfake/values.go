package kvfake

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"mime"
	"mime/multipart"
	"net/http"
	"slices"
	"strconv"
	"strings"
)

// The single-key routes: values, metadata and the key list.

func (s *Server) putValue(w http.ResponseWriter, r *http.Request, key string) {
	q := r.URL.Query()
	exp, err := queryFloat(q, "expiration")
	if err != nil {
		fail(w, http.StatusBadRequest, CodeBadRequest, err.Error())
		return
	}
	ttl, err := queryFloat(q, "expiration_ttl")
	if err != nil {
		fail(w, http.StatusBadRequest, CodeBadRequest, err.Error())
		return
	}
	var value []byte
	var meta json.RawMessage
	mt, params, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if mt == "multipart/form-data" {
		value, meta, err = readMultipart(r.Body, params["boundary"])
		if errors.Is(err, errTooLarge) {
			fail(w, http.StatusRequestEntityTooLarge, CodeValueTooLarge, "value too large")
			return
		}
		if err != nil {
			fail(w, http.StatusBadRequest, CodeBadRequest, err.Error())
			return
		}
	} else {
		value, err = io.ReadAll(io.LimitReader(r.Body, MaxValueBytes+1))
		if err != nil {
			fail(w, http.StatusBadRequest, CodeBadRequest, "could not read the body")
			return
		}
		if len(value) > MaxValueBytes {
			fail(w, http.StatusRequestEntityTooLarge, CodeValueTooLarge, "value too large")
			return
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	expiration, err := s.expiry(exp, ttl)
	if err != nil {
		fail(w, http.StatusBadRequest, CodeBadRequest, err.Error())
		return
	}
	now := s.now()
	if !s.allowWrite(key, now) {
		w.Header().Set("Retry-After", "1")
		fail(w, http.StatusTooManyRequests, CodeKeyRateLimited, "KV PUT failed: 429 Too Many Requests")
		return
	}
	s.recordWrite(key, now)
	s.data[key] = entry{value: value, metadata: meta, expiration: expiration}
	succeed(w, map[string]any{}, nil)
}

var errTooLarge = errors.New("too large")

// readMultipart reads the "value" and "metadata" fields of a form.
func readMultipart(body io.Reader, boundary string) ([]byte, json.RawMessage, error) {
	if boundary == "" {
		return nil, nil, errors.New("multipart body without boundary")
	}
	mr := multipart.NewReader(body, boundary)
	var value []byte
	var meta json.RawMessage
	haveValue := false
	for {
		part, err := mr.NextPart()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, nil, fmt.Errorf("bad multipart body: %w", err)
		}
		switch part.FormName() {
		case "value":
			value, err = io.ReadAll(io.LimitReader(part, MaxValueBytes+1))
			if err != nil {
				return nil, nil, fmt.Errorf("bad multipart value: %w", err)
			}
			if len(value) > MaxValueBytes {
				return nil, nil, errTooLarge
			}
			haveValue = true
		case "metadata":
			m, err := io.ReadAll(io.LimitReader(part, MaxMetadataBytes+1))
			if err != nil {
				return nil, nil, fmt.Errorf("bad multipart metadata: %w", err)
			}
			if err := validMetadata(m); err != nil {
				return nil, nil, err
			}
			meta = m
		}
	}
	if !haveValue {
		return nil, nil, errors.New("multipart body has no value field")
	}
	return value, meta, nil
}

func (s *Server) getValue(w http.ResponseWriter, key string) {
	s.mu.Lock()
	e, found := s.live(key)
	s.mu.Unlock()
	if !found {
		fail(w, http.StatusNotFound, CodeKeyNotFound, "get: 'key not found'")
		return
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	if e.expiration != 0 {
		w.Header().Set("Expiration", strconv.FormatInt(e.expiration, 10))
	}
	w.Header().Set("Content-Length", strconv.Itoa(len(e.value)))
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(e.value)
}

func (s *Server) getMetadata(w http.ResponseWriter, key string) {
	s.mu.Lock()
	e, found := s.live(key)
	s.mu.Unlock()
	if !found {
		fail(w, http.StatusNotFound, CodeKeyNotFound, "metadata: 'key not found'")
		return
	}
	var result any = e.metadata
	if e.metadata == nil {
		result = nil
	}
	succeed(w, result, nil)
}

func (s *Server) deleteValue(w http.ResponseWriter, key string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	if !s.allowWrite(key, now) {
		w.Header().Set("Retry-After", "1")
		fail(w, http.StatusTooManyRequests, CodeKeyRateLimited, "KV DELETE failed: 429 Too Many Requests")
		return
	}
	s.recordWrite(key, now)
	delete(s.data, key)
	succeed(w, map[string]any{}, nil)
}

type listedKey struct {
	Name       string          `json:"name"`
	Expiration int64           `json:"expiration,omitempty"`
	Metadata   json.RawMessage `json:"metadata,omitempty"`
}

func (s *Server) listKeys(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	limit := MaxListLimit
	if v := q.Get("limit"); v != "" {
		f, err := strconv.ParseFloat(v, 64)
		if err != nil || f < MinListLimit || f > MaxListLimit || f != math.Trunc(f) {
			fail(w, http.StatusBadRequest, CodeBadRequest, fmt.Sprintf("limit must be an integer between %d and %d", MinListLimit, MaxListLimit))
			return
		}
		limit = int(f)
	}
	after := ""
	if c := q.Get("cursor"); c != "" {
		b, err := base64.RawURLEncoding.DecodeString(c)
		if err != nil {
			fail(w, http.StatusBadRequest, CodeBadRequest, "invalid cursor")
			return
		}
		after = string(b)
	}
	prefix := q.Get("prefix")
	s.mu.Lock()
	var names []string
	for k := range s.data {
		if _, alive := s.live(k); alive && strings.HasPrefix(k, prefix) && (after == "" || k > after) {
			names = append(names, k)
		}
	}
	slices.Sort(names)
	more := len(names) > limit
	if more {
		names = names[:limit]
	}
	result := make([]listedKey, 0, len(names))
	for _, k := range names {
		e := s.data[k]
		result = append(result, listedKey{Name: k, Expiration: e.expiration, Metadata: e.metadata})
	}
	s.mu.Unlock()
	cursor := ""
	if more {
		cursor = base64.RawURLEncoding.EncodeToString([]byte(names[len(names)-1]))
	}
	succeed(w, result, map[string]any{"count": len(result), "cursor": cursor})
}
