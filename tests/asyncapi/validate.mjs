// Parse an AsyncAPI document with the official parser (@asyncapi/parser) and print its
// diagnostics as JSON lines: {"severity": 0 error | 1 warning | 2 info | 3 hint, "code", "message", "path"}.
// Exit status: 0 when the document parsed without errors, 1 otherwise.
import { readFileSync } from "node:fs";
import { Parser } from "@asyncapi/parser";

const path = process.argv[2];
const parser = new Parser();
const { document, diagnostics } = await parser.parse(readFileSync(path, "utf8"), { source: path });
for (const d of diagnostics) {
  console.log(JSON.stringify({ severity: d.severity, code: d.code, message: d.message, path: d.path }));
}
const errors = diagnostics.filter((d) => d.severity === 0);
process.exit(document === undefined || errors.length > 0 ? 1 : 0);
