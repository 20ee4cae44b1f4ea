package store

import (
	"bytes"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"net"
	"os"
	"path/filepath"
	"time"

	bolt "go.etcd.io/bbolt"
)

// nv-ipam's JSON store (version 1), as its node daemon writes it at --store-file.
// The field order matters: the checksum is FNV-32a over this encoding with the
// checksum field set to 0 and released_at left out.
type nvRoot struct {
	Version  int                `json:"version"`
	Checksum uint32             `json:"checksum"`
	Pools    map[string]*nvPool `json:"pools"`
}

type nvPool struct {
	Name           string              `json:"name"`
	Entries        map[string]*nvEntry `json:"entries"`
	LastPoolConfig string              `json:"last_pool_config"`
	LastReservedIP net.IP              `json:"last_reserved_ip"`
}

type nvEntry struct {
	ContainerID   string     `json:"container_id"`
	InterfaceName string     `json:"interface_name"`
	IPAddress     net.IP     `json:"ip_address"`
	Metadata      nvMetadata `json:"metadata"`
	ReleasedAt    *time.Time `json:"released_at,omitempty"`
}

type nvMetadata struct {
	CreateTime         string `json:"create_time"`
	PodUUID            string `json:"pod_uuid"`
	PodName            string `json:"pod_name"`
	PodNamespace       string `json:"pod_namespace"`
	DeviceID           string `json:"device_id"`
	PoolConfigSnapshot string `json:"pool_config_snapshot"`
}

// BackupSuffix is appended to an imported nv-ipam store's name for the backup kept
// beside the new store.
const BackupSuffix = ".nv-ipam.json"

// looksLikeNVIPAMStore reports whether path holds JSON rather than a bbolt file.
func looksLikeNVIPAMStore(path string) (bool, error) {
	ok, err := fileExists(path)
	if err != nil || !ok {
		return false, err
	}
	f, err := os.Open(path)
	if err != nil {
		return false, fmt.Errorf("store %s: %w", path, err)
	}
	defer f.Close()
	head := make([]byte, 64)
	n, _ := f.Read(head)
	return bytes.HasPrefix(bytes.TrimLeft(head[:n], " \t\r\n"), []byte("{")), nil
}

// importNVIPAM converts the nv-ipam store at path into a bbolt store at the same
// path. The JSON file is kept as path+BackupSuffix. Steps, crash-safe: build the
// new store in a temporary file and sync it; hard-link the original to the backup
// name; rename the temporary file over path. A crash before the rename leaves the
// JSON file in place, and the next start imports again.
func importNVIPAM(path string, opts Options) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("reading nv-ipam store %s: %w", path, err)
	}
	var root nvRoot
	if err := json.Unmarshal(data, &root); err != nil {
		return corrupt(path, fmt.Errorf("not valid nv-ipam store JSON: %w", err))
	}
	if root.Version != 1 {
		return corrupt(path, fmt.Errorf("nv-ipam store version %d, only version 1 can be imported", root.Version))
	}
	if sum, err := nvChecksum(&root); err != nil {
		return err
	} else if sum != root.Checksum {
		return corrupt(path, fmt.Errorf("nv-ipam store checksum %d does not match its content (%d)", root.Checksum, sum))
	}
	tmp := path + ".importing"
	_ = os.Remove(tmp)
	db, err := openBolt(tmp, opts)
	if err != nil {
		return err
	}
	err = db.Update(func(tx *bolt.Tx) error { return writeImported(tx, &root) })
	if cerr := db.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("importing nv-ipam store %s: %w", path, err)
	}
	backup := path + BackupSuffix
	_ = os.Remove(backup)
	if err := os.Link(path, backup); err != nil {
		return fmt.Errorf("keeping nv-ipam store %s as %s: %w", path, backup, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("replacing nv-ipam store %s with the imported store: %w", path, err)
	}
	// Make the link and the rename durable before anything is allocated in the new
	// store: otherwise a power cut could bring back the JSON file and a re-import
	// would drop what was allocated since.
	return syncDir(filepath.Dir(path))
}

// syncDir fsyncs a directory, making the entries created or renamed in it durable.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("syncing directory %s: %w", dir, err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("syncing directory %s: %w", dir, err)
	}
	return nil
}

func writeImported(tx *bolt.Tx, root *nvRoot) error {
	meta, err := tx.CreateBucketIfNotExists(bucketMeta)
	if err != nil {
		return err
	}
	if err := meta.Put(keySchema, []byte(schemaVersion)); err != nil {
		return err
	}
	// Its own log ID: a log left beside the path (of an hwipam store that was
	// there before nv-ipam's came back) is another store's.
	if err := putStoreID(meta); err != nil {
		return err
	}
	pools, err := tx.CreateBucketIfNotExists(bucketPools)
	if err != nil {
		return err
	}
	allocs, err := tx.CreateBucketIfNotExists(bucketAllocations)
	if err != nil {
		return err
	}
	imported := time.Now().UTC()
	for key, p := range root.Pools {
		if p == nil {
			continue
		}
		pl := Pool{Key: key}
		if p.LastReservedIP != nil {
			pl.LastReserved = p.LastReservedIP.String()
		}
		v, err := json.Marshal(pl)
		if err != nil {
			return err
		}
		if err := pools.Put([]byte(key), v); err != nil {
			return err
		}
		b, err := allocs.CreateBucketIfNotExists([]byte(key))
		if err != nil {
			return err
		}
		for entryKey, e := range p.Entries {
			if e == nil || (e.ReleasedAt != nil && !e.ReleasedAt.IsZero()) {
				continue // released by its owner; nv-ipam kept it only for a cooldown
			}
			if e.IPAddress == nil || e.ContainerID == "" {
				return fmt.Errorf("pool %s entry %q: no address or container ID", key, entryKey)
			}
			created, err := time.Parse(time.RFC3339Nano, e.Metadata.CreateTime)
			if err != nil {
				created = imported
			}
			a := Allocation{
				ContainerID: e.ContainerID, IfName: e.InterfaceName, IP: e.IPAddress.String(),
				PodName: e.Metadata.PodName, PodNamespace: e.Metadata.PodNamespace, PodUID: e.Metadata.PodUUID,
				DeviceID: e.Metadata.DeviceID, CreateTime: created,
				// nv-ipam does not know the network; Network stays empty, so CNI GC
				// leaves the allocation alone.
			}
			v, err := json.Marshal(a)
			if err != nil {
				return err
			}
			if err := b.Put([]byte(RecordKey(a.ContainerID, a.IfName)), v); err != nil {
				return err
			}
		}
	}
	return nil
}

// nvChecksum computes nv-ipam's checksum of a store: FNV-32a of its JSON with the
// checksum 0 and released_at omitted.
func nvChecksum(root *nvRoot) (uint32, error) {
	stripped := nvRoot{Version: root.Version, Pools: make(map[string]*nvPool, len(root.Pools))}
	for k, p := range root.Pools {
		if p == nil {
			stripped.Pools[k] = nil
			continue
		}
		cp := *p
		cp.Entries = make(map[string]*nvEntry, len(p.Entries))
		for ek, e := range p.Entries {
			if e == nil {
				cp.Entries[ek] = nil
				continue
			}
			ce := *e
			ce.ReleasedAt = nil
			cp.Entries[ek] = &ce
		}
		if p.Entries == nil {
			cp.Entries = nil
		}
		stripped.Pools[k] = &cp
	}
	if root.Pools == nil {
		stripped.Pools = nil
	}
	data, err := json.Marshal(&stripped)
	if err != nil {
		return 0, fmt.Errorf("encoding nv-ipam store for its checksum: %w", err)
	}
	h := fnv.New32a()
	_, _ = h.Write(data)
	return h.Sum32(), nil
}
