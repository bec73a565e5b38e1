// Package rawio holds the few file operations that pkg/storage and
// pkg/sandbox make with system calls directly instead of through *os.File,
// whose open on a regular file or directory adds four fcntl calls and a
// failed epoll_ctl, more calls than the work itself on the hot paths that
// use this package (a status write, a run's cgroup check). Each call is
// made again while a signal interrupts it, as package os does.
package rawio
