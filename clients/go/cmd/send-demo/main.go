// The sender demo (tests/sending/README.md's protocol): orders whose charge is sent to a
// receiver with an Idempotency-Key made once, in the order's transaction.
//
//	send-demo prepare COUNT PREFIX | work [--until-idle] [--concurrency N] | inline COUNT PREFIX
//
// Environment: DATABASE_URL, RECEIVER_URL, TARGET (receiver), SEND_LEASE_MS (30000),
// SEND_TIMEOUT_MS (10000), RECEIVER_API_KEY (sent as X-Api-Key; send-demo).
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strconv"
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

func envMs(name string, fallback int) time.Duration {
	ms, err := strconv.Atoi(os.Getenv(name))
	if err != nil {
		ms = fallback
	}
	return time.Duration(ms) * time.Millisecond
}

// prepareOrders writes the orders PREFIX-1..COUNT, each in one transaction with its send;
// afterCommit runs after each COMMIT.
func prepareOrders(ctx context.Context, pool *pgxpool.Pool, target string, count int, prefix string,
	afterCommit func(operation string) error) error {
	if _, err := pool.Exec(ctx, schema); err != nil {
		return err
	}
	for i := 1; i <= count; i++ {
		order := fmt.Sprintf("%s-%d", prefix, i)
		operation := order + ":charge"
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			sent, err := idempotency.Prepare(ctx, tx, scope, operation, target,
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
	if command == "prepare" {
		if err := prepareOrders(ctx, pool, target, count, args[1], nil); err != nil {
			return err
		}
		say("prepared %d", count)
		return nil
	}
	flags := flag.NewFlagSet(command, flag.ExitOnError)
	untilIdle := flags.Bool("until-idle", false, "exit once nothing of the target is pending or sending")
	concurrency := flags.Int("concurrency", 4, "sends attempted at once")
	if command == "work" {
		_ = flags.Parse(args)
	}
	sender, err := idempotency.NewSender(pool, idempotency.SenderOptions{
		URLs:         map[string]string{target: os.Getenv("RECEIVER_URL")},
		Headers:      map[string]map[string]string{target: {"X-Api-Key": env("RECEIVER_API_KEY", "send-demo")}},
		Lease:        envMs("SEND_LEASE_MS", 30000),
		Timeout:      envMs("SEND_TIMEOUT_MS", 10000),
		Concurrency:  *concurrency,
		PollInterval: 200 * time.Millisecond,
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
	})
	if err != nil {
		return err
	}
	if command == "inline" {
		return prepareOrders(ctx, pool, target, count, args[1], func(operation string) error {
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
	return sender.Run(stop, target, *untilIdle)
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
	if err := run(context.Background(), args[0], args[1:], count); err != nil {
		fmt.Fprintln(os.Stderr, "send-demo:", err)
		os.Exit(1)
	}
}
