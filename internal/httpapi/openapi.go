package httpapi

import (
	_ "embed"
	"net/http"
)

// OpenAPI is /v1/openapi.json, the OpenAPI 3.1 document of the API.
//
//go:embed openapi.json
var OpenAPI []byte

func serveOpenAPI(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Access-Control-Allow-Origin", "*")
	_, _ = w.Write(OpenAPI)
}
