package main

import "github.com/agentfleet/agentfleet/internal/tenancy"

// tenantTokens is the dashboard's check of tenant tokens (docs/tenancy.md) for
// --auth-dir: nil without one.
func tenantTokens(dir string) (func(string) (string, error), error) {
	if dir == "" {
		return nil, nil
	}
	d, err := tenancy.Open(dir)
	if err != nil {
		return nil, err
	}
	return d.VerifyToken, nil
}
