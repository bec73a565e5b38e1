package tracing

import "go.opentelemetry.io/otel/attribute"

func serviceName(s string) attribute.KeyValue { return attribute.String("service.name", s) }

// GenAI semantic-convention attribute keys the fleet sets.
const (
	GenAIOperationName     = attribute.Key("gen_ai.operation.name")
	GenAIProviderName      = attribute.Key("gen_ai.provider.name")
	GenAIConversationID    = attribute.Key("gen_ai.conversation.id")
	GenAIRequestModel      = attribute.Key("gen_ai.request.model")
	GenAIResponseModel     = attribute.Key("gen_ai.response.model")
	GenAIUsageInputTokens  = attribute.Key("gen_ai.usage.input_tokens")
	GenAIUsageOutputTokens = attribute.Key("gen_ai.usage.output_tokens")
	GenAIToolName          = attribute.Key("gen_ai.tool.name")
	GenAIToolCallID        = attribute.Key("gen_ai.tool.call.id")
	GenAIAgentName         = attribute.Key("gen_ai.agent.name")
	HTTPResponseStatusCode = attribute.Key("http.response.status_code")
	ErrorType              = attribute.Key("error.type")
	FleetTenant            = attribute.Key("fleet.tenant")
	FleetQueryID           = attribute.Key("fleet.query.id")
	FleetAttempt           = attribute.Key("fleet.attempt")
	FleetCostUSD           = attribute.Key("fleet.cost_usd")
	FleetTimeToFirstByteMS = attribute.Key("fleet.time_to_first_byte_ms")
)
