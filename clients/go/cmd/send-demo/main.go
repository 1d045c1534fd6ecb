// The sender demo (tests/sending/README.md's protocol): orders whose charge is sent to a
// receiver with an Idempotency-Key made once, in the order's transaction.
//
//	send-demo prepare COUNT PREFIX | work [--until-idle] [--concurrency N] | inline COUNT PREFIX
//
// Environment: DATABASE_URL, RECEIVER_URL, TARGET (receiver), SEND_LEASE_MS (30000),
// SEND_TIMEOUT_MS (10000), RECEIVER_API_KEY (sent as X-Api-Key; send-demo), and the sender's
// own settings when set: SEND_RETRY_BUDGET, SEND_BACKOFF_BASE_MS, SEND_BACKOFF_CAP_MS,
// SEND_GIVE_UP_AFTER_MS.
//
// A sender the package refuses (SEND_TIMEOUT_MS >= SEND_LEASE_MS, a bad setting) prints
// `refused MESSAGE` and exits 2. The worker prints `db-error CLASS_OR_SQLSTATE MESSAGE` for
// each database error its loop meets and `db-reconnected` when it works again (from the
// package's log records, idempotency.LogDBError and LogDBReconnected).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	idempotency "github.com/idempotency/pg-idempotency-go"
)

const (
	scope  = "send-demo"
	schema = `CREATE TABLE IF NOT EXISTS send_demo_orders (id text PRIMARY KEY, amount int NOT NULL,
  payment_key text NOT NULL)`
	usage = "usage: send-demo prepare COUNT PREFIX | work [--until-idle] [--concurrency N] | inline COUNT PREFIX"
)

var out sync.Mutex // OnAttempt and OnFinished run on several goroutines

func say(format string, args ...any) {
	out.Lock()
	defer out.Unlock()
	fmt.Printf(format+"\n", args...)
}

func describe(r idempotency.Result) string {
	switch r := r.(type) {
	case idempotency.Delivered:
		return "done " + strconv.Itoa(r.Status)
	case idempotency.Unknown:
		return "gave_up unknown"
	case idempotency.NotYet:
		return r.State + " unknown"
	}
	return "lost unknown"
}

func env(name, fallback string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return fallback
}

// settings reads the SEND_* environment into the sender's options: an unset one keeps its
// default (the database's, for the extension's settings).
func settings(o *idempotency.SenderOptions) error {
	for name, into := range map[string]*time.Duration{"SEND_LEASE_MS": &o.Lease, "SEND_TIMEOUT_MS": &o.Timeout,
		"SEND_BACKOFF_BASE_MS": &o.BackoffBase, "SEND_BACKOFF_CAP_MS": &o.BackoffCap,
		"SEND_GIVE_UP_AFTER_MS": &o.GiveUpAfter} {
		if v, ok := os.LookupEnv(name); ok {
			ms, err := strconv.ParseInt(v, 10, 64)
			if err != nil || ms <= 0 {
				return fmt.Errorf("%s must be a positive number of milliseconds (got %q)", name, v)
			}
			*into = time.Duration(ms) * time.Millisecond
		}
	}
	if v, ok := os.LookupEnv("SEND_RETRY_BUDGET"); ok {
		budget, err := strconv.ParseFloat(v, 64)
		if err != nil {
			return fmt.Errorf("SEND_RETRY_BUDGET must be a number (got %q)", v)
		}
		o.RetryBudget = &budget
	}
	return nil
}

// dbEvents prints the worker's log records of database errors and reconnections as the
// protocol's lines, and nothing else.
type dbEvents struct{}

func (dbEvents) Enabled(context.Context, slog.Level) bool { return true }
func (h dbEvents) WithAttrs([]slog.Attr) slog.Handler     { return h }
func (h dbEvents) WithGroup(string) slog.Handler          { return h }
func (dbEvents) Handle(_ context.Context, r slog.Record) error {
	switch r.Message {
	case idempotency.LogDBError:
		var code, message string
		r.Attrs(func(a slog.Attr) bool {
			switch a.Key {
			case "code":
				code = a.Value.String()
			case "error":
				message, _, _ = strings.Cut(strings.TrimSpace(a.Value.String()), "\n")
			}
			return true
		})
		say("db-error %s %s", code, message)
	case idempotency.LogDBReconnected:
		say("db-reconnected")
	}
	return nil
}

// refused is a configuration the package (or this program) refuses: exit 2.
type refused struct{ error }

// prepareOrders writes the orders PREFIX-1..COUNT, each in one transaction with its send;
// afterCommit runs after each COMMIT.
func prepareOrders(ctx context.Context, pool *pgxpool.Pool, sender *idempotency.Sender, target string, count int,
	prefix string, afterCommit func(operation string) error) error {
	if _, err := pool.Exec(ctx, schema); err != nil {
		return err
	}
	for i := 1; i <= count; i++ {
		order := fmt.Sprintf("%s-%d", prefix, i)
		operation := order + ":charge"
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			sent, err := sender.Prepare(ctx, tx, scope, operation, target,
				map[string]any{"amount": i, "currency": "eur"}, idempotency.PrepareOptions{})
			if err != nil {
				return err
			}
			_, err = tx.Exec(ctx, `INSERT INTO send_demo_orders VALUES ($1, $2, $3) ON CONFLICT (id) DO NOTHING`,
				order, i, sent.Key)
			return err
		})
		if err != nil {
			return err
		}
		if afterCommit != nil {
			if err := afterCommit(operation); err != nil {
				return err
			}
		}
	}
	return nil
}

func run(ctx context.Context, command string, args []string, count int) error {
	cfg, err := idempotency.ParseConfig(os.Getenv("DATABASE_URL"))
	if err != nil {
		return err
	}
	cfg.MaxConns = 8
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	target := env("TARGET", "receiver")
	flags := flag.NewFlagSet(command, flag.ExitOnError)
	untilIdle := flags.Bool("until-idle", false, "exit once nothing of the target is pending or sending")
	concurrency := flags.Int("concurrency", 4, "sends attempted at once")
	if command == "work" {
		_ = flags.Parse(args)
	}
	o := idempotency.SenderOptions{
		URLs:         map[string]string{target: os.Getenv("RECEIVER_URL")},
		Headers:      map[string]map[string]string{target: {"X-Api-Key": env("RECEIVER_API_KEY", "send-demo")}},
		Concurrency:  *concurrency,
		PollInterval: 200 * time.Millisecond,
		Logger:       slog.New(dbEvents{}),
		OnAttempt: func(a idempotency.Attempt, answer idempotency.Answer) {
			status := "none"
			if answer.Status != 0 {
				status = strconv.Itoa(answer.Status)
			}
			say("attempt %s %d %s", a.Operation, a.Number, status)
		},
		OnFinished: func(a idempotency.Attempt, r idempotency.Result) {
			say("finished %s %s", a.Operation, describe(r))
		},
	}
	if err := settings(&o); err != nil {
		return refused{err}
	}
	sender, err := idempotency.NewSender(pool, o)
	if err != nil {
		return refused{err}
	}
	switch command {
	case "prepare":
		if err := prepareOrders(ctx, pool, sender, target, count, args[1], nil); err != nil {
			return err
		}
		say("prepared %d", count)
		return nil
	case "inline":
		return prepareOrders(ctx, pool, sender, target, count, args[1], func(operation string) error {
			r, err := sender.Deliver(ctx, scope, operation)
			if err != nil {
				return err
			}
			say("delivered %s %s", operation, describe(r))
			return nil
		})
	}
	// SIGTERM: the attempts in flight are recorded, then Run returns.
	stop, cancel := signal.NotifyContext(ctx, syscall.SIGTERM, os.Interrupt)
	defer cancel()
	sender.Run(stop, target, *untilIdle)
	return nil
}

func main() {
	args := os.Args[1:]
	ok, count := len(args) > 0 && args[0] == "work", 0
	if len(args) == 3 && (args[0] == "prepare" || args[0] == "inline") {
		var err error
		count, err = strconv.Atoi(args[1])
		ok = err == nil && count >= 0
	}
	if !ok {
		fmt.Fprintln(os.Stderr, usage)
		os.Exit(2)
	}
	err := run(context.Background(), args[0], args[1:], count)
	if r := (refused{}); errors.As(err, &r) {
		say("refused %v", r.error)
		os.Exit(2)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "send-demo:", err)
		os.Exit(1)
	}
}
