// Package strictjson decodes JSON from outside the fleet (a tenant's
// request) into the fleet's own types, refusing what encoding/json lets
// through: a key that is not byte-exactly one of the type's field names
// (encoding/json matches keys case-insensitively and with Unicode case
// folding, so "Deliver_Subject", "deliver_ſubject" (U+017F) and a Kelvin
// sign for "k" all reach a field of another spelling), a key given twice
// (encoding/json keeps the last), a field the type does not have, and
// anything after the top-level value.
//
// A caller then builds what it sends on from the typed values, never
// from the bytes it was given.
package strictjson
