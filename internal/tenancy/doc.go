// Package tenancy keeps tenants apart with nats-server's own authorization
// (docs/tenancy.md): decentralized JWTs, one NATS account per tenant.
//
// `dispatcher auth init --dir DIR` makes an operator, the system account
// SYS, the fleet's account FLEET (its streams, the dispatcher, workers and
// admins) and DIR/nats-auth.conf for nats-server to include; `tenant creds`
// adds an account per tenant that imports only its slice of FLEET:
//
//	<p>.jobs.T               service  from <p>.tsub.T: publish jobs; the
//	                                  dispatcher decodes each strictly
//	                                  (ScopeSubmission), publishes the job
//	                                  it builds with Nats-Msg-Id T.<id>,
//	                                  and answers the PubAck
//	<p>.query.T.*.ctl        service  control its own queries
//	<p>.query.T.>            stream   its own query subjects, live
//	<p>.api.>                service  from <p>.tapi.T.>: the fleet API, the
//	                                  tenant taken from the subject by the
//	                                  dispatcher (ScopeJob, ScopeRequest)
//	$JS.FLEET.API.…          service  the JetStream calls a reader of
//	                                  FLEET_QUERIES needs: consumer create,
//	                                  info, delete and message gets from
//	                                  <p>.tjs.T.…, decoded into the fleet's
//	                                  own types (keys byte-exact, see
//	                                  internal/strictjson) and rebuilt by
//	                                  the dispatcher (JSProxy); pulls and
//	                                  direct gets of its subjects straight
//	                                  from FLEET's $JS.API
//
// Nothing else of FLEET is reachable from a tenant's account, and replies
// and deliver subjects a tenant names land in its own account: nats-server
// checks neither against permissions, so one shared account could not keep
// a tenant from making the server write another's subjects (docs/tenancy.md says
// why). Tenant users also carry permissions
// (publish only jobs, API, .ctl and $JS.FLEET.API, with no pulls on the
// fleet's durables; subscribe only their query subjects and inboxes; $SYS
// only USER.INFO).
//
// Revocation re-signs the tenant's account JWT with every user issued until
// now revoked, stores it, and pushes it to the running server on
// $SYS.REQ.CLAIMS.UPDATE (the full resolver): the server disconnects those
// users at once and refuses them from then on. HTTP bearer tokens are
// signed by a key of DIR and checked against the same revocation.
//
// DIR holds secrets (the operator's and accounts' seeds); its files are
// written 0600.
package tenancy
