package workspace

import (
	"errors"
	"fmt"

	"github.com/agentfleet/agentfleet/pkg/protocol"
)

// ErrCheckout is wrapped by every checkout failure that will not go away on
// retry: a repository or ref that does not exist or cannot be read with the
// worker's credentials, a remote the worker does not allow, a repository
// over the size limit. The job fails once with code workspace_checkout.
var ErrCheckout = errors.New("workspace: checkout failed")

// ErrTransient is wrapped by checkout failures worth retrying on another
// attempt (network trouble, a remote answering 5xx, a sandbox that failed).
var ErrTransient = errors.New("workspace: transient failure")

// CheckoutError is a checkout failure. Permanent ones wrap ErrCheckout,
// the others ErrTransient. Its message names the repository (credentials
// redacted) and the ref, and carries git's own reason.
type CheckoutError struct {
	Repo, Ref string
	Reason    string
	Permanent bool
}

func (e *CheckoutError) Error() string {
	ref := e.Ref
	if ref == "" {
		ref = "HEAD"
	}
	return fmt.Sprintf("checking out %s at %s: %s", protocol.RedactRepo(e.Repo), ref, e.Reason)
}

// Is matches ErrCheckout or ErrTransient.
func (e *CheckoutError) Is(target error) bool {
	return e.Permanent && target == ErrCheckout || !e.Permanent && target == ErrTransient
}
