-- idempotency.stats: the in_progress figures an operator alerts on come from the partial
-- index keys_in_progress_idx, never from a scan of every record. (Sequential scans are
-- switched off, as in 09_catalog, to show which index it can use on a table this small.)
-- PostgreSQL 15 prints "InitPlan 1 (returns $0)" where 18 prints "InitPlan 1":
-- 12_stats_plan_1.out is the same plan as 18 prints it.
SET enable_seqscan = off;
EXPLAIN (COSTS OFF) SELECT in_progress, stale, oldest_in_progress_age FROM idempotency.stats;
RESET enable_seqscan;
