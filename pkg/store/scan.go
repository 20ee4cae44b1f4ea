package store

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/netip"

	bolt "go.etcd.io/bbolt"
	"golang.org/x/sys/unix"
)

// RecordKey is the key of the allocation of (containerID, ifName) within its
// pool: the bbolt key of its record, and what the daemon keys its in-memory
// allocations by, so that a release deletes exactly the record it holds.
func RecordKey(containerID, ifName string) string {
	return containerID + "\x00" + ifName
}

// Scan reads the store for the daemon's start: pool is called for every pool
// record, then held for every allocation with its pool key, its RecordKey and
// its address, without decoding the rest of the record (pod metadata is read
// from the store when it is asked for: Get, EachAllocation). All pool keys are
// passed as the same string per pool. A record that does not decode is
// reported as ErrCorrupt.
func (s *Store) Scan(pool func(Pool) error, held func(poolKey, recordKey string, ip netip.Addr) error) (err error) {
	// The scan runs while Open's consistency check still runs, on another core;
	// its verdict comes first.
	defer func() {
		if r := recover(); r != nil {
			err = corrupt(s.path, fmt.Errorf("%v", r))
		}
		if cerr := s.waitChecked(); cerr != nil {
			err = cerr
		}
	}()
	if err := s.settle(); err != nil {
		return err
	}
	err = s.db.View(func(tx *bolt.Tx) error {
		if err := tx.Bucket(bucketPools).ForEach(func(k, v []byte) error {
			p := Pool{Key: string(k)}
			if err := json.Unmarshal(v, &p); err != nil {
				return fmt.Errorf("pool %s: %w", k, err)
			}
			return pool(p)
		}); err != nil {
			return err
		}
		allocs := tx.Bucket(bucketAllocations)
		return allocs.ForEachBucket(func(pk []byte) error {
			poolKey := string(pk)
			return allocs.Bucket(pk).ForEach(func(k, v []byte) error {
				ip, err := recordIP(v)
				if err != nil {
					return fmt.Errorf("allocation %q in pool %s: %w", k, pk, err)
				}
				return held(poolKey, string(k), ip)
			})
		})
	})
	if err != nil {
		return corrupt(s.path, err)
	}
	if err := s.waitChecked(); err != nil {
		return err
	}
	s.unmapRead()
	return nil
}

// unmapRead drops the pages of the file read so far from the daemon's memory
// map: they stay in the page cache, and the daemon maps again only those it
// touches later. After the start-up scan and check, which read every page,
// that keeps the whole file (37 MiB at 100,000 allocations) out of the
// daemon's RSS; commits call it now and then for the same reason
// (unmapNowAndThen). bbolt's map is shared and read-only (writes go through the
// file), so dropping it loses nothing; the kernel still accounts the page
// cache to the container. It runs in a read transaction, during which bbolt
// does not remap.
func (s *Store) unmapRead() {
	_ = s.db.View(func(tx *bolt.Tx) error {
		// The map starts at Info().Data and covers at least the file's used
		// size, tx.Size(). A failure only leaves the pages mapped.
		_, _, _ = unix.Syscall(unix.SYS_MADVISE, s.db.Info().Data, uintptr(tx.Size()), unix.MADV_DONTNEED)
		return nil
	})
}

// Get returns the allocation of (containerID, ifName) in the pool, if any.
func (s *Store) Get(poolKey, containerID, ifName string) (Allocation, bool, error) {
	var a Allocation
	found := false
	if err := s.settle(); err != nil {
		return Allocation{}, false, err
	}
	err := s.db.View(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketAllocations).Bucket([]byte(poolKey))
		if b == nil {
			return nil
		}
		v := b.Get([]byte(RecordKey(containerID, ifName)))
		if v == nil {
			return nil
		}
		found = true
		return json.Unmarshal(v, &a)
	})
	if err != nil {
		return Allocation{}, false, fmt.Errorf("reading allocation %s/%s of pool %s from store %s: %w",
			containerID, ifName, poolKey, s.path, err)
	}
	return a, found, nil
}

// eachChunk is how many records EachAllocation reads per read transaction.
const eachChunk = 1024

// EachAllocation calls fn for every allocation of the pool (of every pool when
// poolKey is empty), in key order; fn's error stops the walk and is returned.
// It reads eachChunk records per read transaction and calls fn outside it, so
// that neither a slow fn nor a walk over 100,000 allocations holds a
// transaction open (a commit that grows the file waits for those) or all the
// records in memory at once. The walk is therefore not one snapshot: an
// allocation made or released meanwhile may or may not be seen, one present
// throughout is seen exactly once.
func (s *Store) EachAllocation(poolKey string, fn func(poolKey string, a Allocation) error) error {
	if err := s.settle(); err != nil {
		return err
	}
	pools := []string{poolKey}
	if poolKey == "" {
		pools = nil
		if err := s.db.View(func(tx *bolt.Tx) error {
			return tx.Bucket(bucketAllocations).ForEachBucket(func(pk []byte) error {
				pools = append(pools, string(pk))
				return nil
			})
		}); err != nil {
			return fmt.Errorf("reading allocations from store %s: %w", s.path, err)
		}
	}
	chunk := make([]Allocation, 0, eachChunk)
	for _, pk := range pools {
		var after []byte // the last key read, nil before the first chunk
		for {
			chunk = chunk[:0]
			err := s.db.View(func(tx *bolt.Tx) error {
				b := tx.Bucket(bucketAllocations).Bucket([]byte(pk))
				if b == nil {
					return nil
				}
				c := b.Cursor()
				k, v := c.First()
				if after != nil {
					if k, v = c.Seek(after); bytes.Equal(k, after) {
						k, v = c.Next()
					}
				}
				for ; k != nil && len(chunk) < eachChunk; k, v = c.Next() {
					if v == nil {
						continue // a nested bucket; pools hold none
					}
					var a Allocation
					if err := json.Unmarshal(v, &a); err != nil {
						return fmt.Errorf("allocation %q in pool %s: %w", k, pk, err)
					}
					chunk = append(chunk, a)
					after = append(after[:0], k...)
				}
				return nil
			})
			if err != nil {
				return fmt.Errorf("reading allocations from store %s: %w", s.path, err)
			}
			for _, a := range chunk {
				if err := fn(pk, a); err != nil {
					return err
				}
			}
			if len(chunk) < eachChunk {
				break
			}
		}
	}
	return nil
}

// recordIP returns the address of an allocation record. Records are JSON
// objects written by encoding/json; recordIP walks the top level of the object
// itself and decodes only the "ip" member, which makes a start over 100,000
// records several times faster than decoding each. Anything it does not
// expect (escapes in the member, a malformed object) goes through
// encoding/json, whose verdict stands.
func recordIP(v []byte) (netip.Addr, error) {
	raw, ok := scanIP(v)
	if !ok {
		var a struct {
			IP string `json:"ip"`
		}
		if err := json.Unmarshal(v, &a); err != nil {
			return netip.Addr{}, err
		}
		raw = []byte(a.IP)
	}
	var ip netip.Addr
	if err := ip.UnmarshalText(raw); err != nil || !ip.IsValid() {
		return netip.Addr{}, fmt.Errorf("address %q is not an IP address", raw)
	}
	return ip, nil
}

// scanIP finds the string value of the top-level member "ip" of the JSON object
// v. It reports false when v is not an object it fully understands, when the
// member is missing or not a plain string, or when a member is named "ip" twice
// (encoding/json lets the last one win; leave such records to it). Every member
// is checked for form, so that a record damaged beyond its address is not
// taken as good.
func scanIP(v []byte) ([]byte, bool) {
	i := skipSpace(v, 0)
	if i >= len(v) || v[i] != '{' {
		return nil, false
	}
	i = skipSpace(v, i+1)
	var ip []byte
	found := false
	if i < len(v) && v[i] == '}' {
		return nil, false
	}
	for {
		name, next, plain := scanString(v, i)
		if next < 0 {
			return nil, false
		}
		i = skipSpace(v, next)
		if i >= len(v) || v[i] != ':' {
			return nil, false
		}
		i = skipSpace(v, i+1)
		if len(name) == 2 && (name[0]|0x20) == 'i' && (name[1]|0x20) == 'p' && string(name) != "ip" {
			return nil, false // encoding/json matches member names case-insensitively
		}
		if plain && string(name) == "ip" {
			val, next, plain := scanString(v, i)
			if next < 0 || !plain || found {
				return nil, false
			}
			ip, found, i = val, true, next
		} else if i = skipValue(v, i, 0); i < 0 {
			return nil, false
		}
		i = skipSpace(v, i)
		switch {
		case i >= len(v):
			return nil, false
		case v[i] == ',':
			i = skipSpace(v, i+1)
		case v[i] == '}':
			if skipSpace(v, i+1) != len(v) || !found {
				return nil, false
			}
			return ip, true
		default:
			return nil, false
		}
	}
}

func skipSpace(v []byte, i int) int {
	for i < len(v) && (v[i] == ' ' || v[i] == '\t' || v[i] == '\n' || v[i] == '\r') {
		i++
	}
	return i
}

// scanString reads the string starting at v[i]; it returns its content, the
// index after it (-1 when there is no well-formed string there) and whether
// the content is plain (no escapes: the bytes are the value).
func scanString(v []byte, i int) (content []byte, next int, plain bool) {
	if i >= len(v) || v[i] != '"' {
		return nil, -1, false
	}
	plain = true
	for j := i + 1; j < len(v); j++ {
		switch c := v[j]; {
		case c == '"':
			return v[i+1 : j], j + 1, plain
		case c == '\\':
			plain = false
			j++ // the escaped byte; \uXXXX's digits pass as plain bytes
		case c < 0x20:
			return nil, -1, false
		}
	}
	return nil, -1, false
}

// skipValue returns the index after the JSON value starting at v[i], or -1.
// Numbers are checked only for their alphabet; encoding/json wrote them.
func skipValue(v []byte, i, depth int) int {
	if i >= len(v) || depth > 32 {
		return -1
	}
	switch c := v[i]; c {
	case '"':
		_, next, _ := scanString(v, i)
		return next
	case '{', '[':
		end := byte('}')
		if c == '[' {
			end = ']'
		}
		i = skipSpace(v, i+1)
		if i < len(v) && v[i] == end {
			return i + 1
		}
		for {
			if c == '{' {
				_, next, _ := scanString(v, i)
				if next < 0 {
					return -1
				}
				i = skipSpace(v, next)
				if i >= len(v) || v[i] != ':' {
					return -1
				}
				i = skipSpace(v, i+1)
			}
			if i = skipValue(v, i, depth+1); i < 0 {
				return -1
			}
			i = skipSpace(v, i)
			switch {
			case i >= len(v):
				return -1
			case v[i] == ',':
				i = skipSpace(v, i+1)
			case v[i] == end:
				return i + 1
			default:
				return -1
			}
		}
	case 't', 'f', 'n':
		for _, lit := range []string{"true", "false", "null"} {
			if len(v)-i >= len(lit) && string(v[i:i+len(lit)]) == lit {
				return i + len(lit)
			}
		}
		return -1
	default:
		j := i
		for j < len(v) && (v[j] >= '0' && v[j] <= '9' || v[j] == '-' || v[j] == '+' || v[j] == '.' || v[j] == 'e' || v[j] == 'E') {
			j++
		}
		if j == i {
			return -1
		}
		return j
	}
}
