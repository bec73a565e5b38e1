package kvfake

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
)

// BulkItem is one element of a bulk write body.
type BulkItem struct {
	Key           string          `json:"key"`
	Value         *string         `json:"value"`
	Base64        bool            `json:"base64"`
	Expiration    *float64        `json:"expiration"`
	ExpirationTTL *float64        `json:"expiration_ttl"`
	Metadata      json.RawMessage `json:"metadata"`
}

func readBulk(r *http.Request, v any) error {
	body, err := io.ReadAll(io.LimitReader(r.Body, MaxBulkBytes+1))
	if err != nil {
		return fmt.Errorf("could not read the body: %w", err)
	}
	if len(body) > MaxBulkBytes {
		return errTooLarge
	}
	if err := json.Unmarshal(body, v); err != nil {
		return fmt.Errorf("body is not a JSON array of the expected shape: %w", err)
	}
	return nil
}

type bulkResult struct {
	SuccessfulKeyCount int      `json:"successful_key_count"`
	UnsuccessfulKeys   []string `json:"unsuccessful_keys"`
}

func (s *Server) bulkPut(w http.ResponseWriter, r *http.Request) {
	var items []BulkItem
	if err := readBulk(r, &items); err != nil {
		if errors.Is(err, errTooLarge) {
			fail(w, http.StatusRequestEntityTooLarge, CodeValueTooLarge, "bulk request larger than 100 MB")
			return
		}
		fail(w, http.StatusBadRequest, CodeBadRequest, err.Error())
		return
	}
	if len(items) > MaxBulkItems {
		fail(w, http.StatusBadRequest, CodeBadRequest, fmt.Sprintf("at most %d pairs per bulk write", MaxBulkItems))
		return
	}
	type decoded struct {
		value []byte
		meta  json.RawMessage
		exp   int64
	}
	vals := make([]decoded, len(items))
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, it := range items {
		if it.Key == "" || len(it.Key) > MaxKeyBytes {
			fail(w, http.StatusBadRequest, CodeKeyTooLong, fmt.Sprintf("item %d: key must be 1 to %d bytes", i, MaxKeyBytes))
			return
		}
		if it.Value == nil {
			fail(w, http.StatusBadRequest, CodeBadRequest, fmt.Sprintf("item %d: value is required", i))
			return
		}
		v := []byte(*it.Value)
		if it.Base64 {
			b, err := base64.StdEncoding.DecodeString(*it.Value)
			if err != nil {
				fail(w, http.StatusBadRequest, CodeBadRequest, fmt.Sprintf("item %d: value is not valid base64", i))
				return
			}
			v = b
		}
		if len(v) > MaxValueBytes {
			fail(w, http.StatusRequestEntityTooLarge, CodeValueTooLarge, fmt.Sprintf("item %d: value too large", i))
			return
		}
		if len(it.Metadata) > 0 && string(it.Metadata) != "null" {
			if err := validMetadata(it.Metadata); err != nil {
				fail(w, http.StatusBadRequest, CodeBadRequest, fmt.Sprintf("item %d: %v", i, err))
				return
			}
			vals[i].meta = bytes.Clone(it.Metadata)
		}
		exp, err := s.expiry(it.Expiration, it.ExpirationTTL)
		if err != nil {
			fail(w, http.StatusBadRequest, CodeBadRequest, fmt.Sprintf("item %d: %v", i, err))
			return
		}
		vals[i].value, vals[i].exp = v, exp
	}
	now := s.now()
	res := bulkResult{UnsuccessfulKeys: []string{}}
	for i, it := range items {
		if (s.BulkUnsuccessful != nil && s.BulkUnsuccessful(it.Key)) || !s.allowWrite(it.Key, now) {
			res.UnsuccessfulKeys = append(res.UnsuccessfulKeys, it.Key)
			continue
		}
		s.recordWrite(it.Key, now)
		s.data[it.Key] = entry{value: vals[i].value, metadata: vals[i].meta, expiration: vals[i].exp}
		res.SuccessfulKeyCount++
	}
	succeed(w, res, nil)
}

func (s *Server) bulkDelete(w http.ResponseWriter, r *http.Request) {
	var keys []string
	if err := readBulk(r, &keys); err != nil {
		fail(w, http.StatusBadRequest, CodeBadRequest, err.Error())
		return
	}
	if len(keys) > MaxBulkItems {
		fail(w, http.StatusBadRequest, CodeBadRequest, fmt.Sprintf("at most %d keys per bulk delete", MaxBulkItems))
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	res := bulkResult{UnsuccessfulKeys: []string{}}
	for _, k := range keys {
		if k == "" || len(k) > MaxKeyBytes {
			fail(w, http.StatusBadRequest, CodeKeyTooLong, fmt.Sprintf("key must be 1 to %d bytes", MaxKeyBytes))
			return
		}
	}
	for _, k := range keys {
		if !s.allowWrite(k, now) {
			res.UnsuccessfulKeys = append(res.UnsuccessfulKeys, k)
			continue
		}
		s.recordWrite(k, now)
		delete(s.data, k)
		res.SuccessfulKeyCount++
	}
	succeed(w, res, nil)
}
