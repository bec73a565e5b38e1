// Command asynqbase is the asynq baseline of `make bench`: the
// fleet's dispatch workload run on asynq and Redis instead. A producer
// enqueues -jobs tasks carrying -prompt; an asynq server with -concurrency
// workers runs each by spawning the agent given after the flags (the same
// argv the fleet's worker gives a one-shot job) with the prompt on its
// stdin, appends each line of its stdout to a Redis stream of its own
// (XADD q:<id>), as the fleet's worker republishes each line, and returns,
// upon which asynq marks the task completed (kept, with Retention, as the
// fleet keeps a status record).
//
// It lives in a module of its own so that the product's go.mod does not
// gain asynq and a Redis client. The harness (internal/bench/asynq_test.go)
// starts redis-server, then this program, and talks to it over stdin and
// stdout, so that it can read both processes' CPU from /proc around the
// run alone:
//
//	asynqbase -redis 127.0.0.1:6379 -jobs 1000 -concurrency 8 -prompt hi -- agent --print ...
//	> ready                  (connected; nothing enqueued yet)
//	< go
//	> done <seconds>         (every task completed, as asynq's inspector counts them)
//	< check
//	> ok completed=<n> lines=<n>   (tasks asynq holds completed, lines in Redis)
//
// Then it exits when its stdin closes.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
)

const taskType = "agent:run"

// job is a task's payload.
type job struct {
	ID     string `json:"id"`
	Prompt string `json:"prompt"`
}

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "asynqbase:", err)
		os.Exit(1)
	}
}

func run() error {
	addr := flag.String("redis", "", "Redis address (host:port)")
	jobs := flag.Int("jobs", 0, "tasks to enqueue")
	conc := flag.Int("concurrency", 0, "asynq workers (the fleet's slots)")
	prompt := flag.String("prompt", "hi", "each task's prompt, the agent's stdin")
	flag.Parse()
	argv := flag.Args()
	if *addr == "" || *jobs < 1 || *conc < 1 || len(argv) == 0 {
		return errors.New("usage: asynqbase -redis host:port -jobs N -concurrency C [-prompt P] -- agent [args...]")
	}
	opt := asynq.RedisClientOpt{Addr: *addr, PoolSize: *conc + 4}
	rdb := redis.NewClient(&redis.Options{Addr: *addr, PoolSize: *conc + 4})
	defer rdb.Close()
	ctx := context.Background()
	if err := rdb.Ping(ctx).Err(); err != nil {
		return fmt.Errorf("redis %s: %w", *addr, err)
	}
	client := asynq.NewClient(opt)
	defer client.Close()
	insp := asynq.NewInspector(opt)
	defer insp.Close()

	var handled atomic.Int64
	allHandled := make(chan struct{})
	srv := asynq.NewServer(opt, asynq.Config{
		Concurrency: *conc,
		LogLevel:    asynq.WarnLevel,
		// The default, 1 s, is how long the only dequeuing loop sleeps
		// when it finds the queue empty: a server started before its
		// first task would idle up to 1.5 s. Checking every 10 ms keeps
		// asynq from losing time to its poll; its polling's CPU is counted.
		TaskCheckInterval: 10 * time.Millisecond,
	})
	handler := asynq.HandlerFunc(func(ctx context.Context, t *asynq.Task) error {
		var j job
		if err := json.Unmarshal(t.Payload(), &j); err != nil {
			return fmt.Errorf("%w: %w", err, asynq.SkipRetry)
		}
		if err := runAgent(ctx, rdb, argv, j); err != nil {
			return err
		}
		if handled.Add(1) == int64(*jobs) {
			close(allHandled)
		}
		return nil
	})

	in := bufio.NewScanner(os.Stdin)
	fmt.Println("ready")
	if !in.Scan() || in.Text() != "go" {
		return errors.New("no go on stdin")
	}
	start := time.Now()
	for i := range *jobs {
		b, _ := json.Marshal(job{ID: "a" + strconv.Itoa(i), Prompt: *prompt})
		if _, err := client.Enqueue(asynq.NewTask(taskType, b), asynq.MaxRetry(0), asynq.Retention(time.Hour)); err != nil {
			return fmt.Errorf("enqueue: %w", err)
		}
		if i == 0 {
			// Started once there is work, so its first dequeue finds it.
			if err := srv.Start(handler); err != nil {
				return fmt.Errorf("asynq server: %w", err)
			}
		}
	}
	defer srv.Shutdown()
	// The inspector's queue info is costly to Redis (it samples memory
	// use): it is asked only once every handler has returned, for asynq's
	// marking of the last tasks completed.
	<-allHandled
	if err := waitCompleted(insp, *jobs); err != nil {
		return err
	}
	fmt.Printf("done %.6f\n", time.Since(start).Seconds())
	if !in.Scan() || in.Text() != "check" {
		return errors.New("no check on stdin")
	}
	lines, err := countLines(ctx, rdb, *jobs)
	if err != nil {
		return err
	}
	qi, err := insp.GetQueueInfo("default")
	if err != nil {
		return fmt.Errorf("queue info: %w", err)
	}
	fmt.Printf("ok completed=%d lines=%d\n", qi.Completed, lines)
	_, _ = io.Copy(io.Discard, os.Stdin)
	return nil
}

// runAgent spawns argv with j's prompt on its stdin and appends each line
// of its stdout to the stream q:<id>, with its number.
func runAgent(ctx context.Context, rdb *redis.Client, argv []string, j job) error {
	c := exec.CommandContext(ctx, argv[0], argv[1:]...)
	c.Stdin = strings.NewReader(j.Prompt)
	out, err := c.StdoutPipe()
	if err != nil {
		return err
	}
	if err := c.Start(); err != nil {
		return err
	}
	br := bufio.NewReaderSize(out, 64<<10)
	stream := "q:" + j.ID
	var xerr error
	for seq := 1; ; seq++ {
		line, err := br.ReadBytes('\n')
		if len(line) > 0 && xerr == nil {
			xerr = rdb.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: []any{"seq", seq, "line", line}}).Err()
		}
		if err != nil {
			break
		}
	}
	if err := c.Wait(); err != nil {
		return fmt.Errorf("agent: %w", err)
	}
	return xerr
}

// waitCompleted polls asynq's inspector until n tasks of the default queue
// are completed; it fails as soon as one has failed (archived).
func waitCompleted(insp *asynq.Inspector, n int) error {
	for {
		qi, err := insp.GetQueueInfo("default")
		if err != nil {
			return fmt.Errorf("queue info: %w", err)
		}
		if qi.Archived > 0 {
			return fmt.Errorf("%d of %d tasks failed", qi.Archived, n)
		}
		if qi.Completed >= n {
			return nil
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// countLines is the number of lines stored in the n tasks' streams.
func countLines(ctx context.Context, rdb *redis.Client, n int) (int64, error) {
	pipe := rdb.Pipeline()
	lens := make([]*redis.IntCmd, n)
	for i := range n {
		lens[i] = pipe.XLen(ctx, "q:a"+strconv.Itoa(i))
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return 0, fmt.Errorf("count lines: %w", err)
	}
	var sum int64
	for _, l := range lens {
		sum += l.Val()
	}
	return sum, nil
}
