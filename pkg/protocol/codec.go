package protocol

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"unicode/utf8"

	"github.com/vmihailenco/msgpack/v5"
)

// Codec encodes and decodes wire types. The receiver of a message picks the
// codec from the message's Content-Type header (see CodecFor), never by
// guessing from the bytes.
type Codec interface {
	// Marshal encodes v.
	Marshal(v any) ([]byte, error)
	// Unmarshal decodes data into v, a non-nil pointer.
	Unmarshal(data []byte, v any) error
	// ContentType is the value of the Content-Type header for this codec.
	ContentType() string
}

// JSON is the default Codec (application/json), built on encoding/json.
type JSON struct{}

// Marshal encodes v with encoding/json.
func (JSON) Marshal(v any) ([]byte, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("protocol: json marshal %T: %w", v, err)
	}
	return b, nil
}

// Unmarshal decodes one JSON value into v. Unknown object keys are ignored.
func (JSON) Unmarshal(data []byte, v any) error {
	if err := json.Unmarshal(data, v); err != nil {
		return fmt.Errorf("protocol: json unmarshal %T: %w", v, err)
	}
	return nil
}

// ContentType returns ContentTypeJSON.
func (JSON) ContentType() string { return ContentTypeJSON }

// Msgpack is the MessagePack Codec (application/msgpack), built on
// github.com/vmihailenco/msgpack/v5 with the msgpack struct tags of the wire
// types. Maps are encoded with sorted keys so the output is deterministic.
// Times decode in time.Local; compare them with time.Time.Equal.
type Msgpack struct{}

// Marshal encodes v as MessagePack.
func (Msgpack) Marshal(v any) ([]byte, error) {
	var buf bytes.Buffer
	enc := msgpack.NewEncoder(&buf)
	enc.SetSortMapKeys(true)
	if err := enc.Encode(v); err != nil {
		return nil, fmt.Errorf("protocol: msgpack marshal %T: %w", v, err)
	}
	return buf.Bytes(), nil
}

// Unmarshal decodes exactly one MessagePack value into v; trailing bytes are
// an error. Unknown map keys are ignored.
//
// data is checked before decoding (see checkMsgpack) so that a hostile length
// prefix cannot make the decoder allocate more than len(data) suggests.
func (Msgpack) Unmarshal(data []byte, v any) error {
	if err := checkMsgpack(data); err != nil {
		return fmt.Errorf("protocol: msgpack unmarshal %T: %w", v, err)
	}
	if err := msgpack.NewDecoder(bytes.NewReader(data)).Decode(v); err != nil {
		return fmt.Errorf("protocol: msgpack unmarshal %T: %w", v, err)
	}
	return nil
}

// ContentType returns ContentTypeMsgpack.
func (Msgpack) ContentType() string { return ContentTypeMsgpack }

// CodecFor returns the codec for a Content-Type header value: JSON for "" and
// application/json, Msgpack for application/msgpack. Parameters such as
// "; charset=utf-8" and letter case are ignored. Any other type gives an
// error wrapping ErrUnsupportedContentType.
func CodecFor(contentType string) (Codec, error) {
	switch mediaType(contentType) {
	case "", ContentTypeJSON:
		return JSON{}, nil
	case ContentTypeMsgpack:
		return Msgpack{}, nil
	default:
		return nil, fmt.Errorf("%w: %s", ErrUnsupportedContentType, quoteShort(contentType))
	}
}

// mediaType is the lower-cased media type of a Content-Type value, without parameters.
func mediaType(contentType string) string {
	mt, _, _ := strings.Cut(contentType, ";")
	return strings.ToLower(strings.TrimSpace(mt))
}

// DecodeJob decodes a job body with the codec chosen by contentType
// ("" or application/json → JSON; application/msgpack → msgpack). It does not
// validate. On a decode error it returns what it could read (possibly with ID
// and Tenant set) together with an error wrapping ErrInvalidJob.
//
// The returned *Job is never nil. Errors are *ValidationError naming the
// offending field: "Content-Type" for an unsupported content type, "body" for
// a body over MaxJobBytes, not an object or not parseable, the JSON path of a
// value of the wrong type ("options.max_turns: must be an integer, got
// string"), or the path of a JSON string that is not valid UTF-8. On error
// the job only carries the ID and Tenant of ProbeIdentity, so a worker can
// publish a failed status with code invalid_job when both are set.
func DecodeJob(contentType string, data []byte) (*Job, error) {
	codec, err := CodecFor(contentType)
	if err != nil {
		return probedJob(contentType, data), invalid(HeaderContentType,
			fmt.Sprintf("unsupported content type %s, want %s or %s", quoteShort(contentType), ContentTypeJSON, ContentTypeMsgpack))
	}
	if len(data) > MaxJobBytes {
		return probedJob(contentType, data), invalid("body", fmt.Sprintf("is %d bytes, at most %d allowed", len(data), MaxJobBytes))
	}
	var job Job
	switch codec.(type) {
	case Msgpack:
		err = decodeMsgpackJob(data, &job)
	default:
		err = decodeJSONJob(data, &job)
	}
	if err != nil {
		return probedJob(contentType, data), err
	}
	return &job, nil
}

func decodeJSONJob(data []byte, job *Job) error {
	trimmed := bytes.TrimLeft(data, " \t\r\n")
	if len(trimmed) == 0 || trimmed[0] != '{' {
		return invalid("body", "must be a JSON object")
	}
	if err := json.Unmarshal(data, job); err != nil {
		return jsonDecodeError(err)
	}
	// encoding/json silently replaces invalid UTF-8 with U+FFFD; the job format
	// rejects it instead, naming the field that holds it.
	if !utf8.Valid(data) {
		field := jsonPathAt(data, invalidUTF8Offset(data))
		if field == "" {
			field = "body"
		}
		return invalid(field, "is not valid UTF-8")
	}
	return nil
}

func decodeMsgpackJob(data []byte, job *Job) error {
	if len(data) == 0 || !isMsgpackMap(data[0]) {
		return invalid("body", "must be a msgpack map")
	}
	if err := checkMsgpack(data); err != nil {
		return invalid("body", "invalid msgpack: "+err.Error())
	}
	err := msgpack.NewDecoder(bytes.NewReader(data)).Decode(job)
	if err == nil {
		return nil
	}
	// msgpack errors do not name fields. Re-decode the body loosely and run it
	// through the JSON decoder, whose type errors carry the field path.
	var loose any
	if msgpack.NewDecoder(bytes.NewReader(data)).Decode(&loose) == nil {
		if b, jerr := json.Marshal(loose); jerr == nil {
			var probe Job
			var ve *ValidationError
			if jerr = json.Unmarshal(b, &probe); jerr != nil && errors.As(jsonDecodeError(jerr), &ve) && ve.Field != "body" {
				return ve
			}
		}
	}
	return invalid("body", "invalid msgpack: "+strings.TrimPrefix(err.Error(), "msgpack: "))
}

// isMsgpackMap reports whether c is the first byte of a msgpack map.
func isMsgpackMap(c byte) bool { return c&0xf0 == 0x80 || c == 0xde || c == 0xdf }

// jsonDecodeError turns an encoding/json error into a *ValidationError.
func jsonDecodeError(err error) error {
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		if te.Field == "" {
			return invalid("body", "must be a JSON object")
		}
		return invalid(te.Field, fmt.Sprintf("must be %s, got %s", describeField(te.Field, te.Type), te.Value))
	}
	var se *json.SyntaxError
	if errors.As(err, &se) {
		return invalid("body", fmt.Sprintf("invalid JSON at byte %d: %v", se.Offset, se))
	}
	return invalid("body", "invalid JSON: "+err.Error())
}

// describeField says in words what JSON type the Job field at path takes.
// path is the dotted JSON path of json.UnmarshalTypeError.Field; fallback is
// used when the path does not name a Job field.
func describeField(path string, fallback reflect.Type) string {
	t := reflect.TypeFor[Job]()
	for part := range strings.SplitSeq(path, ".") {
		if t.Kind() != reflect.Struct {
			return describeType(fallback)
		}
		found := false
		for i := range t.NumField() {
			f := t.Field(i)
			name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
			if name == part {
				t, found = f.Type, true
				break
			}
		}
		if !found {
			return describeType(fallback)
		}
	}
	return describeType(t)
}

func describeType(t reflect.Type) string {
	if t == nil {
		return "a different type"
	}
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t.Kind() {
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "a boolean"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "an integer"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.Slice, reflect.Array:
		return "an array of " + withoutArticle(describeType(t.Elem())) + "s"
	case reflect.Map:
		return "an object with " + withoutArticle(describeType(t.Elem())) + " values"
	case reflect.Struct:
		return "an object"
	default:
		return "a " + t.Kind().String()
	}
}

func withoutArticle(s string) string {
	if rest, ok := strings.CutPrefix(s, "an "); ok {
		return rest
	}
	return strings.TrimPrefix(s, "a ")
}

// invalidUTF8Offset is the offset of the first byte of data that is not part
// of a valid UTF-8 sequence (len(data) if there is none).
func invalidUTF8Offset(data []byte) int {
	for i := 0; i < len(data); {
		r, size := utf8.DecodeRune(data[i:])
		if r == utf8.RuneError && size <= 1 {
			return i
		}
		i += size
	}
	return len(data)
}

// jsonPathAt returns the path ("options.allowed_tools[2]", "metadata.k") of
// the JSON token that contains byte offset off of data, which must be
// syntactically valid JSON. It returns "" when off is outside every token.
func jsonPathAt(data []byte, off int) string {
	type frame struct {
		object  bool
		wantKey bool
		key     string
		index   int
	}
	var stack []frame
	path := func() string {
		var sb strings.Builder
		for _, f := range stack {
			if f.object {
				if sb.Len() > 0 {
					sb.WriteByte('.')
				}
				sb.WriteString(f.key)
			} else {
				fmt.Fprintf(&sb, "[%d]", f.index)
			}
		}
		return sb.String()
	}
	valueDone := func() {
		if n := len(stack); n > 0 {
			if stack[n-1].object {
				stack[n-1].wantKey = true
			} else {
				stack[n-1].index++
			}
		}
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	for {
		tok, err := dec.Token()
		if err != nil {
			return ""
		}
		end := int(dec.InputOffset())
		switch t := tok.(type) {
		case json.Delim:
			switch t {
			case '{', '[':
				stack = append(stack, frame{object: t == '{', wantKey: t == '{'})
			default:
				stack = stack[:len(stack)-1]
				valueDone()
			}
		default:
			n := len(stack)
			if n > 0 && stack[n-1].object && stack[n-1].wantKey {
				s, _ := t.(string)
				stack[n-1].key, stack[n-1].wantKey = s, false
				if end > off {
					return path()
				}
				continue
			}
			if end > off {
				return path()
			}
			valueDone()
		}
	}
}

// ProbeIdentity reads the id and tenant of a job body on a best-effort basis,
// decoding nothing else, so that a job that fails DecodeJob or Validate can
// still be reported on its status subject. Each value is returned only when
// it matches IDPattern or TenantPattern (so it is safe in a subject), else "".
// An unsupported content type is tried as JSON, then as msgpack.
func ProbeIdentity(contentType string, data []byte) (id, tenant string) {
	var probe struct {
		ID     string `json:"id"`
		Tenant string `json:"tenant"`
	}
	switch mediaType(contentType) {
	case "", ContentTypeJSON:
		_ = json.Unmarshal(data, &probe)
	case ContentTypeMsgpack:
		probe.ID, probe.Tenant = probeMsgpack(data)
	default:
		if json.Unmarshal(data, &probe) != nil && probe.ID == "" {
			probe.ID, probe.Tenant = probeMsgpack(data)
		}
	}
	if ValidID(probe.ID) {
		id = probe.ID
	}
	if ValidTenant(probe.Tenant) {
		tenant = probe.Tenant
	}
	return id, tenant
}

func probedJob(contentType string, data []byte) *Job {
	id, tenant := ProbeIdentity(contentType, data)
	return &Job{ID: id, Tenant: tenant}
}
