// Package fleetapi is the small client of the fleet's NATS API that the
// dispatcher's command line (internal/fleetcli), the dashboard and the tests
// share: submit, cancel, status and list go to the dispatcher's
// <prefix>.api.* subjects (request/reply, JSON); Follow replays a query from
// its first message on FLEET_QUERIES and follows it live; Queue tells where a
// queued job stands (its position and how many workers are there to take
// it).
//
// # Errors
//
// A request nobody answers (no responders, timeout) is ErrUnavailable; a
// query that does not exist is ErrNotFound (Follow) or an API reply whose
// error code is protocol.CodeNotFound (Status, Cancel). Everything else is
// returned as is, wrapped with the subject it concerns.
package fleetapi
