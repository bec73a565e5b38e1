// Command shapecheck reports the places where the code outgrows the shape
// the project holds itself to: production files over 600 lines, functions
// over 100 lines and types with more than 25 methods. `make lint` runs it;
// it exits 1 when it finds any.
//
//	go run ./internal/shapecheck [dir]
package main

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

const (
	maxFileLines = 600
	maxFuncLines = 100
	maxMethods   = 25
)

// exempt names the types allowed past maxMethods: the subject-name table is
// one method per subject by design.
var exempt = map[string]bool{"protocol.Names": true}

func main() {
	root := "."
	if len(os.Args) > 1 {
		root = os.Args[1]
	}
	problems, err := check(root)
	if err != nil {
		fmt.Fprintln(os.Stderr, "shapecheck:", err)
		os.Exit(2)
	}
	for _, p := range problems {
		fmt.Println(p)
	}
	if len(problems) > 0 {
		os.Exit(1)
	}
}

func check(root string) ([]string, error) {
	var problems []string
	methods := map[string]int{}
	fset := token.NewFileSet()
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			switch d.Name() {
			case "node_modules", ".git", ".tools", "testdata", "bin":
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		if n := fset.Position(f.End()).Line; n > maxFileLines {
			problems = append(problems, fmt.Sprintf("%s: %d lines (at most %d)", path, n, maxFileLines))
		}
		for _, decl := range f.Decls {
			fn, ok := decl.(*ast.FuncDecl)
			if !ok || fn.Body == nil {
				continue
			}
			lines := fset.Position(fn.End()).Line - fset.Position(fn.Pos()).Line + 1
			name := fn.Name.Name
			if fn.Recv != nil && len(fn.Recv.List) > 0 {
				recv := recvName(fn.Recv.List[0].Type)
				name = recv + "." + name
				methods[f.Name.Name+"."+recv]++
			}
			if lines > maxFuncLines {
				problems = append(problems, fmt.Sprintf("%s: func %s is %d lines (at most %d)", fset.Position(fn.Pos()), name, lines, maxFuncLines))
			}
		}
		return nil
	})
	keys := make([]string, 0, len(methods))
	for k := range methods {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if methods[k] > maxMethods && !exempt[k] {
			problems = append(problems, fmt.Sprintf("type %s has %d methods (at most %d)", k, methods[k], maxMethods))
		}
	}
	return problems, err
}

func recvName(e ast.Expr) string {
	switch t := e.(type) {
	case *ast.StarExpr:
		return recvName(t.X)
	case *ast.IndexExpr:
		return recvName(t.X)
	case *ast.IndexListExpr:
		return recvName(t.X)
	case *ast.Ident:
		return t.Name
	}
	return "?"
}
