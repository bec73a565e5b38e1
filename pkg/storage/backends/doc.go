// Package backends turns a storage URL (--storage, --status-storage) into a
// storage.Store.
//
//	file://./data, file:///var/lib/fleet   storage.FS on that directory (relative paths are
//	                                       relative to the working directory)
//	nats://                                JetStream on the fleet's own connection (Deps.JS): a KV
//	                                       bucket for the Status role, an Object Store bucket for
//	                                       the Objects role; ?bucket=NAME overrides Deps' bucket names,
//	                                       ?replicas=N (1-5) Deps.Replicas
//	s3://bucket?endpoint=…&region=auto     R2 or any S3, opened by the function registered for "s3"
//	cfkv://<account_id>/<namespace_id>     Workers KV, opened by the function registered for "cfkv"
//
// file and nats are built in. Other schemes are added with Register, so this
// package does not link the AWS or Cloudflare SDKs: the binaries register
// pkg/storage/s3 and pkg/storage/cfkv in main. An unknown or unregistered
// scheme is an error naming the schemes that are known.
//
// The Role says what the store will hold: Objects (transcripts, journal
// chunks, large lines) or Status (one small record per query). A backend may
// open different things per role (nats:// does); FS uses the same directory
// layout for both, so one file:// URL can serve both roles.
package backends
