// Package fleetcli is the dispatcher's command line for people and scripts:
// submit, tail, status, cancel, ls and version. It talks to the fleet
// through internal/fleetapi.
//
// # Commands
//
// Each command is one type in its own file (submit.go, tail.go, …) that
// implements Command: its Help (arguments, description, examples), its own
// flags on its own FlagSet, Validate (usage errors, exit 2, before anything
// connects) and Run. The common flags (NATS URL and credentials, prefix,
// logging, request timeout) are added by Run to every command. A new command
// is a new file and one line in the commands list in cli.go.
//
// # Exit codes
//
// See the Exit* constants: scripts depend on them, so they never change
// meaning. A command stopped by a signal exits 128+N (130 for SIGINT, 143
// for SIGTERM), as shells do; the query itself keeps running and the
// command says how to re-attach.
package fleetcli
