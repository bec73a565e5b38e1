package strictjson

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"
	"slices"
	"strings"
	"sync"
)

// maxDepth bounds the nesting of objects and arrays.
const maxDepth = 32

// Error is a refused input, naming where (a path like config.name).
type Error struct {
	Path, Reason string
}

func (e *Error) Error() string {
	if e.Path == "" {
		return e.Reason
	}
	return e.Path + ": " + e.Reason
}

// Decode decodes data (one JSON value) into v (a non-nil pointer).
// Every object key must be byte-exactly the JSON name of one of the
// struct's fields (any key in a map), at most once per object; values
// of types with their own UnmarshalJSON are checked for duplicate keys
// only.
func Decode(data []byte, v any) error {
	rv := reflect.ValueOf(v)
	if rv.Kind() != reflect.Pointer || rv.IsNil() {
		return errors.New("strictjson: Decode needs a non-nil pointer")
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	if err := walk(dec, rv.Type().Elem(), "", 0); err != nil {
		return err
	}
	if _, err := dec.Token(); err != io.EOF {
		return &Error{Reason: "data after the JSON value"}
	}
	d := json.NewDecoder(bytes.NewReader(data))
	d.DisallowUnknownFields()
	if err := d.Decode(v); err != nil {
		return &Error{Reason: err.Error()}
	}
	return nil
}

var (
	unmarshalerType = reflect.TypeFor[json.Unmarshaler]()
	anyType         = reflect.TypeFor[any]()
)

// walk reads one value from dec, checking its keys against t.
func walk(dec *json.Decoder, t reflect.Type, path string, depth int) error {
	if depth > maxDepth {
		return &Error{Path: path, Reason: fmt.Sprintf("nested more than %d deep", maxDepth)}
	}
	tok, err := dec.Token()
	if err != nil {
		return &Error{Path: path, Reason: "invalid JSON: " + err.Error()}
	}
	delim, ok := tok.(json.Delim)
	if !ok {
		return nil // a scalar: its type is json.Unmarshal's to check
	}
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	opaque := t.Kind() == reflect.Interface || t.Implements(unmarshalerType) || reflect.PointerTo(t).Implements(unmarshalerType)
	if delim == '[' {
		elem := anyType
		if !opaque && (t.Kind() == reflect.Slice || t.Kind() == reflect.Array) {
			elem = t.Elem()
		}
		for dec.More() {
			if err := walk(dec, elem, path+"[]", depth+1); err != nil {
				return err
			}
		}
		return closing(dec, path)
	}
	seen := map[string]bool{}
	for dec.More() {
		kt, err := dec.Token()
		if err != nil {
			return &Error{Path: path, Reason: "invalid JSON: " + err.Error()}
		}
		key, _ := kt.(string)
		at := join(path, key)
		if seen[key] {
			return &Error{Path: at, Reason: "given twice"}
		}
		seen[key] = true
		elem := anyType
		switch {
		case opaque:
		case t.Kind() == reflect.Struct:
			ft, ok := fieldsOf(t)[key]
			if !ok {
				return &Error{Path: at, Reason: fmt.Sprintf("unknown field (allowed: %s)", strings.Join(names(t), ", "))}
			}
			elem = ft
		case t.Kind() == reflect.Map:
			elem = t.Elem()
		}
		if err := walk(dec, elem, at, depth+1); err != nil {
			return err
		}
	}
	return closing(dec, path)
}

// closing reads the end of an object or array.
func closing(dec *json.Decoder, path string) error {
	tok, err := dec.Token()
	if err != nil {
		return &Error{Path: path, Reason: "invalid JSON: " + err.Error()}
	}
	if _, ok := tok.(json.Delim); !ok {
		return &Error{Path: path, Reason: "invalid JSON"}
	}
	return nil
}

func join(path, key string) string {
	if path == "" {
		return fmt.Sprintf("%q", key)
	}
	return fmt.Sprintf("%s.%q", path, key)
}

var fieldCache sync.Map // reflect.Type → map[string]reflect.Type

// fieldsOf maps the JSON names of struct type t's fields (promoted from
// untagged embedded structs too) to their types.
func fieldsOf(t reflect.Type) map[string]reflect.Type {
	if m, ok := fieldCache.Load(t); ok {
		return m.(map[string]reflect.Type)
	}
	m := map[string]reflect.Type{}
	for i := range t.NumField() {
		f := t.Field(i)
		tag := f.Tag.Get("json")
		name, _, _ := strings.Cut(tag, ",")
		if name == "-" && tag == "-" {
			continue
		}
		if f.Anonymous && name == "" {
			et := f.Type
			if et.Kind() == reflect.Pointer {
				et = et.Elem()
			}
			if et.Kind() == reflect.Struct {
				for k, v := range fieldsOf(et) {
					if _, ok := m[k]; !ok {
						m[k] = v
					}
				}
				continue
			}
		}
		if !f.IsExported() {
			continue
		}
		if name == "" {
			name = f.Name
		}
		m[name] = f.Type
	}
	fieldCache.Store(t, m)
	return m
}

func names(t reflect.Type) []string {
	var out []string
	for k := range fieldsOf(t) {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}
