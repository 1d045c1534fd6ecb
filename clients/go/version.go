package idempotency

// Version is this module's release; its tag is "v" + Version. scripts/build-artifacts.sh go
// builds the module of that version as the Go module proxy will serve it.
const Version = "0.1.0"
