package storage

// Workspace artifacts of docs/workspaces.md live beside the transcript:
//
//	queries/<tenant>/<id>/workspace/diff.patch   git diff --binary start_sha end_sha
//	queries/<tenant>/<id>/workspace/bundle       git bundle of the work branch, prerequisite start_sha

// WorkspacePrefix is the prefix of a query's workspace artifacts.
func WorkspacePrefix(tenant, id string) string { return QueryPrefix(tenant, id) + "workspace/" }

// DiffKey is the key of a query's stored diff.
func DiffKey(tenant, id string) string { return WorkspacePrefix(tenant, id) + "diff.patch" }

// BundleKey is the key of a query's stored git bundle.
func BundleKey(tenant, id string) string { return WorkspacePrefix(tenant, id) + "bundle" }
