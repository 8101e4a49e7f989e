import PubSubCore
import Yams

/// Reading PrivatePub's `config/private_pub.yml` as PrivatePub reads it (`YAML.load_file(file)[environment]`),
/// with Yams (libyaml). It lives in the CLI, the only reader, so that PubSubCore does not carry a YAML parser.
///
/// A real YAML parser reads every spelling of the file (quotes, comments, `---`, flow mappings, shared defaults
/// through an anchor and a merge key, `defaults: &defaults` … `<<: *defaults`); what a PrivatePub section cannot
/// hold (nested mappings, lists, block scalars) is refused with the line number rather than guessed at.
extension PrivatePubConfiguration {
    /// Reads the section named `environment` of the YAML `text`; `file` only names the file in errors.
    static func parse(_ text: String, environment: String, file: String = "private_pub.yml") throws
        -> PrivatePubConfiguration
    {
        let root: Node?
        do {
            root = try Yams.compose(yaml: text)
        } catch let error as YamlError {
            throw PrivatePubConfigurationError(describe(error, file: file, text: text))
        }
        // A top-level scalar is no environment: PrivatePub would fail on it as on a missing one.
        guard let section = root?.mapping.flatMap({ value(of: environment, in: $0) }),
            section.scalar == nil || isNull(section)
        else {
            throw PrivatePubConfigurationError("The \(environment) environment does not exist in \(file)")
        }
        if section.sequence != nil {
            throw PrivatePubConfigurationError(
                "\(file):\(section.mark?.line ?? 0): lists are not part of a PrivatePub configuration")
        }
        var configuration = PrivatePubConfiguration()
        for (key, value) in try entries(of: section, file: file) {
            switch key {
            case "server":
                configuration.server = value
            case "secret_token":
                configuration.secretToken = value
            case "signature_expiration":
                guard let value else { break }
                guard let seconds = Double(value), seconds.isFinite, seconds >= 0 else {
                    throw PrivatePubConfigurationError(
                        "\(file): signature_expiration in \(environment) must be a number of seconds, not '\(value)'")
                }
                configuration.signatureExpiration = seconds
            default:
                break  // PrivatePub ignores other keys too.
            }
        }
        return configuration
    }

    /// The value of the key spelled `name` in `mapping`.
    private static func value(of name: String, in mapping: Node.Mapping) -> Node? {
        mapping.first(where: { $0.key.string == name })?.value
    }

    private static func isNull(_ node: Node) -> Bool {
        node.scalar != nil && node.tag.rawValue == Tag.Name.null.rawValue
    }

    /// The section's `key: value` pairs as text (nil for YAML null), merged keys (`<<`) after the section's own,
    /// which win over them.
    private static func entries(of section: Node, file: String) throws -> [(String, String?)] {
        guard let mapping = section.mapping else { return [] }  // `production:` alone: an empty section.
        func fail(_ node: Node, _ why: String) -> PrivatePubConfigurationError {
            PrivatePubConfigurationError("\(file):\(node.mark?.line ?? 0): \(why)")
        }
        var own: [(String, String?)] = []
        var merged: [(String, String?)] = []
        for (keyNode, value) in mapping {
            guard let key = keyNode.string else { throw fail(keyNode, "keys must be plain or quoted text") }
            if key == "<<" {
                let sources = value.sequence.map(Array.init) ?? [value]
                for source in sources {
                    guard source.mapping != nil else { throw fail(value, "merge key needs an alias such as *defaults") }
                    for (k, v) in try entries(of: source, file: file) where !merged.contains(where: { $0.0 == k }) {
                        merged.append((k, v))
                    }
                }
                continue
            }
            switch value {
            case .mapping:
                throw fail(value, "nested mappings are not part of a PrivatePub configuration")
            case .sequence:
                throw fail(value, "lists are not part of a PrivatePub configuration")
            case .scalar(let scalar):
                guard scalar.style != .literal, scalar.style != .folded else {
                    throw fail(value, "only plain or quoted scalar values are supported")
                }
                own.append((key, isNull(value) ? nil : scalar.string))
            case .alias:
                throw fail(value, "only plain or quoted scalar values are supported")
            }
        }
        return own + merged.filter { m in !own.contains { $0.0 == m.0 } }
    }

    /// libyaml's complaint as `file:line: problem`, one line.
    private static func describe(_ error: YamlError, file: String, text: String) -> String {
        switch error {
        case .scanner(let context, let problem, let mark, _), .parser(let context, let problem, let mark, _),
            .composer(let context, let problem, let mark, _):
            let line =
                text.split(separator: "\n", omittingEmptySubsequences: false)
                .dropFirst(mark.line - 1).first ?? ""
            if problem.contains("cannot start any token"),
                line.prefix(while: { $0 == " " || $0 == "\t" }).contains("\t")
            {
                return "\(file):\(mark.line): tabs are not allowed for indentation in YAML"
            }
            let during = context.map { " (\($0.text), line \($0.mark.line))" } ?? ""
            return "\(file):\(mark.line): \(problem)\(during)"
        case .duplicatedKeysInMapping(let duplicates, let context):
            return "\(file):\(context.mark.line): duplicated key \(duplicates.joined(separator: ", "))"
        case .reader(let problem, _, _, _):
            return "\(file): \(problem)"
        default:
            return "\(file): \(error)"
        }
    }
}
