package store

import "golang.org/x/sys/unix"

// HoldCheckpoints keeps the checkpointer from applying the log to the bbolt
// file until release is called, so that commits are only in the log. Reads
// wait for the checkpointer: a test does not read while it holds it. A log that
// fills up is still checkpointed by the commit that finds it full.
func (s *Store) HoldCheckpoints() (release func()) {
	s.wal.held.Store(true)
	return func() {
		s.wal.held.Store(false)
		select {
		case s.wal.kick <- struct{}{}:
		default:
		}
	}
}

// Crash abandons the store as a killed process would leave it: what is written
// stays written (the page cache outlives a process), nothing pending is applied
// and nothing more is flushed. A checkpoint under way finishes first.
func (s *Store) Crash() {
	<-s.checked
	s.wal.closeOnce.Do(func() { close(s.wal.stop) })
	<-s.wal.ended
	<-s.wal.flushEnd
	unlock := s.wal.lockAll()
	s.wal.err = errClosed
	_ = s.wal.closeFile()
	unlock()
	_ = s.db.Close()
}

// BreakLog closes the log's file under the store, so that its next write fails.
func (s *Store) BreakLog() {
	s.wal.syncMu.Lock()
	defer s.wal.syncMu.Unlock()
	_ = unix.Close(s.wal.fd)
	s.wal.fd = -1 // a write now fails (EBADF), and no other file gets the number's writes
}

// BreakFlush makes every later flush of the log to the disk fail, as a disk
// error would.
func (s *Store) BreakFlush() { s.wal.flushFault.Store(true) }

// LogProgress is the last sequence number written to the log's file and the
// last flushed to the disk.
func (s *Store) LogProgress() (saved, flushed uint64) {
	return s.wal.saved.Load(), s.wal.flushed.Load()
}

// LogEnd is the log's path and the offset after its last record.
func (s *Store) LogEnd() (path string, off int64) {
	s.wal.mu.Lock()
	defer s.wal.mu.Unlock()
	return s.wal.path, s.wal.off
}
