package cniplugin

import (
	"errors"
	"strconv"
	"unicode/utf16"
	"unicode/utf8"
)

// A strict JSON reader for the fast path (fast.go), which must not pay for
// encoding/json's reflection on every exec. It reads RFC 8259 JSON into a small
// tree and refuses anything encoding/json would read differently (invalid UTF-8,
// lone surrogates, nesting over 64 levels); a refusal only sends the call down the
// full path, which then decides.

type jkind uint8

const (
	jNull jkind = iota
	jBool
	jNum
	jStr
	jArr
	jObj
)

// jvalue is one JSON value: s holds a string's value or a number's text; an
// object keeps its members in order, duplicates included.
type jvalue struct {
	kind jkind
	b    bool
	s    string
	arr  []*jvalue
	keys []string
	vals []*jvalue
}

var errJSON = errors.New("not JSON the fast path reads")

const jsonMaxDepth = 64

type jparser struct {
	data []byte
	pos  int
}

// parseJSONLite reads one JSON value that fills data (whitespace aside).
func parseJSONLite(data []byte) (*jvalue, error) {
	p := &jparser{data: data}
	v, err := p.value(0)
	if err != nil {
		return nil, err
	}
	p.space()
	if p.pos != len(p.data) {
		return nil, errJSON
	}
	return v, nil
}

func (p *jparser) space() {
	for p.pos < len(p.data) {
		switch p.data[p.pos] {
		case ' ', '\t', '\n', '\r':
			p.pos++
		default:
			return
		}
	}
}

func (p *jparser) literal(word string) bool {
	if len(p.data)-p.pos >= len(word) && string(p.data[p.pos:p.pos+len(word)]) == word {
		p.pos += len(word)
		return true
	}
	return false
}

func (p *jparser) value(depth int) (*jvalue, error) {
	if depth > jsonMaxDepth {
		return nil, errJSON
	}
	p.space()
	if p.pos >= len(p.data) {
		return nil, errJSON
	}
	switch c := p.data[p.pos]; {
	case c == '{':
		return p.object(depth)
	case c == '[':
		return p.array(depth)
	case c == '"':
		s, err := p.str()
		return &jvalue{kind: jStr, s: s}, err
	case c == 't' && p.literal("true"):
		return &jvalue{kind: jBool, b: true}, nil
	case c == 'f' && p.literal("false"):
		return &jvalue{kind: jBool}, nil
	case c == 'n' && p.literal("null"):
		return &jvalue{kind: jNull}, nil
	case c == '-' || c >= '0' && c <= '9':
		return p.number()
	}
	return nil, errJSON
}

func (p *jparser) object(depth int) (*jvalue, error) {
	p.pos++ // {
	v := &jvalue{kind: jObj}
	p.space()
	if p.pos < len(p.data) && p.data[p.pos] == '}' {
		p.pos++
		return v, nil
	}
	for {
		p.space()
		if p.pos >= len(p.data) || p.data[p.pos] != '"' {
			return nil, errJSON
		}
		k, err := p.str()
		if err != nil {
			return nil, err
		}
		p.space()
		if p.pos >= len(p.data) || p.data[p.pos] != ':' {
			return nil, errJSON
		}
		p.pos++
		val, err := p.value(depth + 1)
		if err != nil {
			return nil, err
		}
		v.keys, v.vals = append(v.keys, k), append(v.vals, val)
		p.space()
		if p.pos >= len(p.data) {
			return nil, errJSON
		}
		switch p.data[p.pos] {
		case ',':
			p.pos++
		case '}':
			p.pos++
			return v, nil
		default:
			return nil, errJSON
		}
	}
}

func (p *jparser) array(depth int) (*jvalue, error) {
	p.pos++ // [
	v := &jvalue{kind: jArr}
	p.space()
	if p.pos < len(p.data) && p.data[p.pos] == ']' {
		p.pos++
		return v, nil
	}
	for {
		val, err := p.value(depth + 1)
		if err != nil {
			return nil, err
		}
		v.arr = append(v.arr, val)
		p.space()
		if p.pos >= len(p.data) {
			return nil, errJSON
		}
		switch p.data[p.pos] {
		case ',':
			p.pos++
		case ']':
			p.pos++
			return v, nil
		default:
			return nil, errJSON
		}
	}
}

// str reads a string at p.pos (its opening quote).
func (p *jparser) str() (string, error) {
	p.pos++
	start := p.pos
	// Fast: no escapes, ASCII or valid UTF-8.
	for p.pos < len(p.data) {
		c := p.data[p.pos]
		if c == '"' {
			s := p.data[start:p.pos]
			p.pos++
			if !utf8.Valid(s) {
				return "", errJSON
			}
			return string(s), nil
		}
		if c == '\\' {
			break
		}
		if c < 0x20 {
			return "", errJSON
		}
		p.pos++
	}
	out := append([]byte(nil), p.data[start:p.pos]...)
	for p.pos < len(p.data) {
		c := p.data[p.pos]
		switch {
		case c == '"':
			p.pos++
			if !utf8.Valid(out) {
				return "", errJSON
			}
			return string(out), nil
		case c < 0x20:
			return "", errJSON
		case c != '\\':
			out = append(out, c)
			p.pos++
			continue
		}
		if p.pos+1 >= len(p.data) {
			return "", errJSON
		}
		e := p.data[p.pos+1]
		p.pos += 2
		switch e {
		case '"', '\\', '/':
			out = append(out, e)
		case 'b':
			out = append(out, '\b')
		case 'f':
			out = append(out, '\f')
		case 'n':
			out = append(out, '\n')
		case 'r':
			out = append(out, '\r')
		case 't':
			out = append(out, '\t')
		case 'u':
			r, ok := p.hex4()
			if !ok {
				return "", errJSON
			}
			if utf16.IsSurrogate(r) {
				// Only a high surrogate followed by a low one makes a rune.
				if p.pos+1 >= len(p.data) || p.data[p.pos] != '\\' || p.data[p.pos+1] != 'u' {
					return "", errJSON
				}
				p.pos += 2
				r2, ok := p.hex4()
				if !ok {
					return "", errJSON
				}
				if r = utf16.DecodeRune(r, r2); r == utf8.RuneError {
					return "", errJSON
				}
			}
			out = utf8.AppendRune(out, r)
		default:
			return "", errJSON
		}
	}
	return "", errJSON
}

func (p *jparser) hex4() (rune, bool) {
	if p.pos+4 > len(p.data) {
		return 0, false
	}
	n, err := strconv.ParseUint(string(p.data[p.pos:p.pos+4]), 16, 32)
	if err != nil {
		return 0, false
	}
	p.pos += 4
	return rune(n), true
}

// number reads -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)? and keeps its text.
func (p *jparser) number() (*jvalue, error) {
	start := p.pos
	digits := func() int {
		n := 0
		for p.pos < len(p.data) && p.data[p.pos] >= '0' && p.data[p.pos] <= '9' {
			p.pos++
			n++
		}
		return n
	}
	if p.data[p.pos] == '-' {
		p.pos++
	}
	if p.pos < len(p.data) && p.data[p.pos] == '0' {
		p.pos++
	} else if digits() == 0 {
		return nil, errJSON
	}
	if p.pos < len(p.data) && p.data[p.pos] == '.' {
		p.pos++
		if digits() == 0 {
			return nil, errJSON
		}
	}
	if p.pos < len(p.data) && (p.data[p.pos] == 'e' || p.data[p.pos] == 'E') {
		p.pos++
		if p.pos < len(p.data) && (p.data[p.pos] == '+' || p.data[p.pos] == '-') {
			p.pos++
		}
		if digits() == 0 {
			return nil, errJSON
		}
	}
	return &jvalue{kind: jNum, s: string(p.data[start:p.pos])}, nil
}

// The typed reads below follow encoding/json's rules for the Go types of
// netConf and FileConfig, and refuse (errJSON) wherever encoding/json would fail
// or could read differently: a member whose name matches a field only
// case-insensitively, or twice, or with bytes outside ASCII; a value of another
// type; a number that is not an integer in range.

// members maps each of fields to its value in object v (absent: nil). v must be an
// object or null.
func (v *jvalue) members(fields ...string) ([]*jvalue, error) {
	out := make([]*jvalue, len(fields))
	if v == nil || v.kind == jNull {
		return out, nil
	}
	if v.kind != jObj {
		return nil, errJSON
	}
	for i, k := range v.keys {
		for j := range len(k) {
			if k[j] >= utf8.RuneSelf {
				return nil, errJSON
			}
		}
		for f, name := range fields {
			if !asciiEqualFold(k, name) {
				continue
			}
			if k != name || out[f] != nil {
				return nil, errJSON
			}
			out[f] = v.vals[i]
		}
	}
	return out, nil
}

func asciiEqualFold(a, b string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range len(a) {
		x, y := a[i], b[i]
		if 'A' <= x && x <= 'Z' {
			x += 'a' - 'A'
		}
		if 'A' <= y && y <= 'Z' {
			y += 'a' - 'A'
		}
		if x != y {
			return false
		}
	}
	return true
}

// str reads a string member into dst (null and absent leave it).
func (v *jvalue) str(dst *string) error {
	switch {
	case v == nil || v.kind == jNull:
		return nil
	case v.kind == jStr:
		*dst = v.s
		return nil
	}
	return errJSON
}

func (v *jvalue) boolean(dst *bool) error {
	switch {
	case v == nil || v.kind == jNull:
		return nil
	case v.kind == jBool:
		*dst = v.b
		return nil
	}
	return errJSON
}

// integer reads an integer that fits bits into *dst (null: nil).
func (v *jvalue) integer(bits int) (*int64, error) {
	switch {
	case v == nil || v.kind == jNull:
		return nil, nil
	case v.kind != jNum:
		return nil, errJSON
	}
	n, err := strconv.ParseInt(v.s, 10, bits)
	if err != nil {
		return nil, errJSON
	}
	return &n, nil
}

func (v *jvalue) strings() ([]string, error) {
	switch {
	case v == nil || v.kind == jNull:
		return nil, nil
	case v.kind != jArr:
		return nil, errJSON
	}
	out := make([]string, len(v.arr))
	for i, e := range v.arr {
		if err := e.str(&out[i]); err != nil {
			return nil, err
		}
	}
	return out, nil
}
