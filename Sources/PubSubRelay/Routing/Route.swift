import Bayeux

/// One route: the channels a change of one collection goes to, from a template over its row or document.
///
///     public.notes=/users/{owner_id}/notes        a column of the row
///     notes=/users/{doc.owner}/notes              a field of the document (`doc.` is optional, `a.b` walks objects)
///     notes=/teams/{doc.members[]}/notes          an array field: one channel per element
///     notes=/users/{user}/notes                   a variable of the source (Simperium: the token's user)
///
/// Each value becomes one whole segment, escaped with `ChannelSegment` (reversible, never a wildcard, never
/// another segment), so a value such as `*`, `**`, `../x`, `/admin` or the empty string can only ever name a
/// channel of this template's shape. The first segment is always literal, so no value can make a `/meta` or
/// `/service` channel.
public struct Route: Sendable, Hashable, CustomStringConvertible {
    public struct Field: Sendable, Hashable {
        /// The path into the row or document (`["owner_id"]`, `["owner", "id"]`), without a leading `doc`.
        public var path: [String]
        /// `{doc.…}`: the document only, never a source variable.
        public var documentOnly: Bool
        /// `[]` at the end: the value is an array and every element names a channel.
        public var fansOut: Bool
    }

    public enum Segment: Sendable, Hashable {
        case literal(String)
        case field(Field)
    }

    /// The collection this route is for, as the relay names it (`public.notes`, a CouchDB or Sync Gateway
    /// database, a Simperium bucket): the change's collection segments joined by `.`.
    public var collection: String
    public var segments: [Segment]
    /// The template as written (`/users/{owner_id}/notes`), for logs and metrics.
    public var template: String

    /// The fields the template reads.
    public var fields: [Field] {
        segments.compactMap { if case .field(let field) = $0 { field } else { nil } }
    }

    public var description: String { collection + "=" + template }

    /// Parses `COLLECTION=TEMPLATE`.
    public init(parsing text: String) throws(RelayError) {
        guard let equals = text.firstIndex(of: "=") else {
            throw RelayError(
                .configuration,
                "route \(text): expected COLLECTION=/channel/{field}, e.g. public.notes=/users/{owner_id}/notes")
        }
        let collection = String(text[..<equals])
        guard !collection.isEmpty else { throw RelayError(.configuration, "route \(text): the collection is empty") }
        try self.init(collection: collection, template: String(text[text.index(after: equals)...]))
    }

    public init(collection: String, template: String) throws(RelayError) {
        func refuse(_ why: String) -> RelayError {
            RelayError(.configuration, "route \(collection)=\(template): \(why)")
        }
        guard template.hasPrefix("/") else { throw refuse("the channel must start with /") }
        let parts = template.dropFirst().split(separator: "/", omittingEmptySubsequences: false)
        var segments: [Segment] = []
        var fanOuts = 0
        for (index, part) in parts.enumerated() {
            guard !part.isEmpty else { throw refuse("a segment is empty") }
            if part.hasPrefix("{") || part.hasSuffix("}") {
                guard part.hasPrefix("{"), part.hasSuffix("}"), part.count > 2 else {
                    throw refuse("a field must be a whole segment, as /users/{owner_id}")
                }
                guard index > 0 else {
                    throw refuse("the first segment must be literal (a value could otherwise make /meta or /service)")
                }
                var inner = Substring(part.dropFirst().dropLast())
                var fansOut = false
                if inner.hasSuffix("[]") {
                    fansOut = true
                    fanOuts += 1
                    inner = inner.dropLast(2)
                }
                var path = inner.split(separator: ".", omittingEmptySubsequences: false).map(String.init)
                var documentOnly = false
                if path.count > 1 && path[0] == "doc" {
                    documentOnly = true
                    path.removeFirst()
                }
                guard path.allSatisfy(Self.isFieldName) else {
                    throw refuse("{\(inner)} is not a field path (names of letters, digits, _ - $ @ :, joined by .)")
                }
                segments.append(.field(Field(path: path, documentOnly: documentOnly, fansOut: fansOut)))
            } else {
                guard part != "*", part != "**", part.utf8.allSatisfy(Self.isChannelByte) else {
                    throw refuse("\(part) is not a channel segment (letters, digits and - _ ! ~ ( ) $ @)")
                }
                if index == 0 && (part == "meta" || part == "service") {
                    throw refuse("/\(part) channels are reserved")
                }
                segments.append(.literal(String(part)))
            }
        }
        guard fanOuts <= 1 else { throw refuse("at most one field may fan out with []") }
        self.collection = collection
        self.segments = segments
        self.template = template
    }

    static func isFieldName(_ name: String) -> Bool {
        !name.isEmpty
            && name.utf8.allSatisfy { byte in
                ChannelSegment.isKept(byte) || byte == UInt8(ascii: "$") || byte == UInt8(ascii: ":")
            }
    }

    static func isChannelByte(_ byte: UInt8) -> Bool {
        ChannelSegment.isKept(byte) || byte == UInt8(ascii: "$")
    }

    /// Why a route gave no channel for a row.
    public enum Unroutable: String, Sendable, Hashable, CaseIterable {
        /// A field is NULL or missing.
        case null
        /// A field is an object, or an array without `[]`, or an array of objects.
        case type
        /// An array field (`[]`) is empty: the row has no audience on this route.
        case empty
        /// An array field names more channels than a change may go to.
        case fanOut = "fan_out"
        /// An update or delete whose previous values the source did not give and the relay does not remember:
        /// the old audience cannot be told.
        case noPrevious = "no_previous"
    }

    public enum Resolution: Sendable, Equatable {
        case channels([String])
        case unroutable(Unroutable)
    }

    /// The channels of this route for `row`; `variables` are the source's (`user`), read before the row for a
    /// field not written `{doc.…}`.
    public func channels(for row: JSONObject, variables: [String: String] = [:], maxChannels: Int) -> Resolution {
        var prefix = ""
        var fanned: [String]?
        var suffix = ""
        for segment in segments {
            let piece: String
            switch segment {
            case .literal(let text):
                piece = text
            case .field(let field):
                if !field.documentOnly, field.path.count == 1, let variable = variables[field.path[0]] {
                    piece = ChannelSegment.escape(variable)
                    break
                }
                let value = Self.value(at: field.path, in: row)
                if field.fansOut {
                    var elements: [String] = []
                    var seen = Set<String>()
                    switch value {
                    case .null:
                        return .unroutable(.null)
                    case .array(let items):
                        for item in items {
                            if case .null = item { continue }
                            guard let text = Self.text(of: item) else { return .unroutable(.type) }
                            if seen.insert(text).inserted { elements.append(ChannelSegment.escape(text)) }
                        }
                    default:
                        guard let text = Self.text(of: value) else { return .unroutable(.type) }
                        elements.append(ChannelSegment.escape(text))
                    }
                    if elements.isEmpty { return .unroutable(.empty) }
                    if elements.count > maxChannels { return .unroutable(.fanOut) }
                    fanned = elements
                    continue
                }
                if case .null = value { return .unroutable(.null) }
                guard let text = Self.text(of: value) else { return .unroutable(.type) }
                piece = ChannelSegment.escape(text)
            }
            if fanned == nil { prefix += "/" + piece } else { suffix += "/" + piece }
        }
        guard let fanned else { return .channels([prefix]) }
        return .channels(fanned.map { prefix + "/" + $0 + suffix })
    }

    /// The value at `path`; `.null` when a step is missing or not an object.
    static func value(at path: [String], in row: JSONObject) -> JSONValue {
        var object = row
        for (index, name) in path.enumerated() {
            guard let value = object[name] else { return .null }
            if index == path.count - 1 { return value }
            guard let next = value.objectValue else { return .null }
            object = next
        }
        return .null
    }

    /// A scalar as one segment's text: a string as is, a number as written, a boolean as `true`/`false`.
    static func text(of value: JSONValue) -> String? {
        switch value {
        case .string(let text): text
        case .number(let text): text
        case .bool(let flag): flag ? "true" : "false"
        default: nil
        }
    }
}
