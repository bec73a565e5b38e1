package trigger

import (
	"bytes"
	"encoding/json"
	"strings"
	"text/template"
	"text/template/parse"
)

// sampleFields is a body for checking tmpl at add: each field its
// placeholders name, as a short non-empty string.
func sampleFields(tmpl json.RawMessage) map[string]any {
	out := map[string]any{}
	var doc any
	if json.NewDecoder(bytes.NewReader(tmpl)).Decode(&doc) != nil {
		return out
	}
	var visit func(any)
	visit = func(v any) {
		switch x := v.(type) {
		case string:
			if !strings.Contains(x, "{{") {
				return
			}
			if t, err := template.New("").Parse(x); err == nil && t.Tree != nil {
				walkFields(t.Root, func(name string) { out[name] = "sample" })
			}
		case map[string]any:
			for _, e := range x {
				visit(e)
			}
		case []any:
			for _, e := range x {
				visit(e)
			}
		}
	}
	visit(doc)
	return out
}

// walkFields calls found with the first identifier of every field a
// template's node refers to.
func walkFields(n parse.Node, found func(string)) {
	switch x := n.(type) {
	case *parse.ListNode:
		if x != nil {
			for _, c := range x.Nodes {
				walkFields(c, found)
			}
		}
	case *parse.ActionNode:
		walkFields(x.Pipe, found)
	case *parse.PipeNode:
		if x != nil {
			for _, c := range x.Cmds {
				walkFields(c, found)
			}
		}
	case *parse.CommandNode:
		for _, a := range x.Args {
			walkFields(a, found)
		}
	case *parse.FieldNode:
		if len(x.Ident) > 0 {
			found(x.Ident[0])
		}
	case *parse.IfNode:
		walkBranch(&x.BranchNode, found)
	case *parse.RangeNode:
		walkBranch(&x.BranchNode, found)
	case *parse.WithNode:
		walkBranch(&x.BranchNode, found)
	}
}

func walkBranch(b *parse.BranchNode, found func(string)) {
	walkFields(b.Pipe, found)
	walkFields(b.List, found)
	if b.ElseList != nil {
		walkFields(b.ElseList, found)
	}
}
