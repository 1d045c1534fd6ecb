module example.com/idempotency-example-go

go 1.23

require github.com/jackc/pgx/v5 v5.7.6
