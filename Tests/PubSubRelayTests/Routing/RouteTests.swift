import Bayeux
import Testing

@testable import PubSubRelay

/// Routes: the grammar, the escaping of values into segments, and what each change becomes.
@Suite struct RouteTests {
    static func route(_ text: String) throws -> Route { try Route(parsing: text) }

    static func row(_ text: String) -> JSONObject { try! JSONParser().parse(text).objectValue! }

    static func channels(_ route: Route, _ row: String, variables: [String: String] = [:]) -> Route.Resolution {
        route.channels(for: Self.row(row), variables: variables, maxChannels: 1000)
    }

    @Test func theGrammarReadsColumnsFieldPathsArraysAndVariables() throws {
        let column = try Self.route("public.notes=/users/{owner_id}/notes")
        #expect(column.collection == "public.notes")
        #expect(column.fields == [Route.Field(path: ["owner_id"], documentOnly: false, fansOut: false)])
        let path = try Self.route("notes=/orgs/{doc.org.id}/docs")
        #expect(path.fields == [Route.Field(path: ["org", "id"], documentOnly: true, fansOut: false)])
        let array = try Self.route("notes=/teams/{doc.members[]}/notes")
        #expect(array.fields == [Route.Field(path: ["members"], documentOnly: true, fansOut: true)])
        #expect(Self.channels(column, #"{"owner_id":"u1","body":"x"}"#) == .channels(["/users/u1/notes"]))
        #expect(Self.channels(path, #"{"org":{"id":7}}"#) == .channels(["/orgs/7/docs"]))
        #expect(
            Self.channels(array, #"{"members":["a","b","a",null]}"#) == .channels(["/teams/a/notes", "/teams/b/notes"]))
        let user = try Self.route("notes=/users/{user}/notes")
        #expect(
            Self.channels(user, #"{"user":"doc"}"#, variables: ["user": "me@x"]) == .channels(["/users/me@x/notes"]))
        let docUser = try Self.route("notes=/users/{doc.user}/notes")
        #expect(
            Self.channels(docUser, #"{"user":"doc"}"#, variables: ["user": "me@x"]) == .channels(["/users/doc/notes"]))
    }

    /// No value can make a wildcard, another channel, a `/meta` channel or an empty segment.
    @Test(arguments: [
        ("*", "/users/$2A/notes"), ("**", "/users/$2A$2A/notes"), ("../x", "/users/$2E$2E$2Fx/notes"),
        ("/admin", "/users/$2Fadmin/notes"), ("", "/users/$/notes"), ("meta", "/users/meta/notes"),
        ("a b", "/users/a$20b/notes"), ("$2A", "/users/$242A/notes"),
    ])
    func everyValueIsOneEscapedSegment(_ value: String, _ expected: String) throws {
        let route = try Self.route("public.notes=/users/{owner_id}/notes")
        let row: JSONObject = ["owner_id": .string(value)]
        #expect(route.channels(for: row, maxChannels: 10) == .channels([expected]))
        guard case .channels(let channels) = route.channels(for: row, maxChannels: 10) else { return }
        #expect(Channel.kind(of: channels[0]) == .name)
        #expect(!Channel.isMeta(channels[0]) && !Channel.isService(channels[0]))
        #expect(ChannelSegment.unescape(String(channels[0].split(separator: "/")[1])) == value)
    }

    @Test(arguments: [
        "nonsense", "=/users/{id}", "public.notes=users/{id}", "public.notes=/{owner_id}/notes",
        "public.notes=/users/*/x", "public.notes=/users/**", "public.notes=/meta/{owner_id}",
        "public.notes=/service/{owner_id}", "public.notes=/users/u{owner_id}", "public.notes=/users//x",
        "public.notes=/users/{}", "public.notes=/users/{a b}", "public.notes=/t/{a[]}/{b[]}",
        "public.notes=/users/{owner_id", "public.notes=/a.b/{x}",
    ])
    func aBadRouteIsRefusedWithOneLine(_ text: String) {
        #expect(throws: RelayError.self) { try Route(parsing: text) }
        do {
            _ = try Route(parsing: text)
        } catch {
            #expect(error.code == .configuration && !error.message.contains("\n") && error.message.contains("route"))
        }
    }

    @Test func aValueThatNamesNoChannelSaysWhy() throws {
        let route = try Self.route("t.n=/users/{owner}/n")
        #expect(Self.channels(route, #"{"owner":null}"#) == .unroutable(.null))
        #expect(Self.channels(route, #"{}"#) == .unroutable(.null))
        #expect(Self.channels(route, #"{"owner":{"a":1}}"#) == .unroutable(.type))
        #expect(Self.channels(route, #"{"owner":["a"]}"#) == .unroutable(.type))
        #expect(Self.channels(route, #"{"owner":12.5}"#) == .channels(["/users/12$2E5/n"]))
        #expect(Self.channels(route, #"{"owner":true}"#) == .channels(["/users/true/n"]))
        let array = try Self.route("t.n=/teams/{members[]}/n")
        #expect(Self.channels(array, #"{"members":[]}"#) == .unroutable(.empty))
        #expect(Self.channels(array, #"{"members":[{"x":1}]}"#) == .unroutable(.type))
        #expect(Self.channels(array, #"{"members":"solo"}"#) == .channels(["/teams/solo/n"]))
        let many = Self.row(#"{"members":[\#((0..<11).map { "\"m\($0)\"" }.joined(separator: ","))]}"#)
        #expect(array.channels(for: many, maxChannels: 10) == .unroutable(.fanOut))
        #expect(array.channels(for: many, maxChannels: 11) != .unroutable(.fanOut))
    }

    // MARK: What a change becomes

    static let mapping = ChangeMapping(
        prefix: "/changes", includeDocument: true,
        routes: [
            try! Route(parsing: "public.notes=/users/{owner_id}/notes"),
            try! Route(parsing: "public.notes=/teams/{team_id}/notes"),
        ])

    static func change(_ op: Change.Operation, _ document: String?, previous: String? = nil) -> Change {
        Change(
            collection: ["public", "notes"], id: "n1", operation: op, seq: "0/1:1",
            document: document.map(row), previous: previous.map(row))
    }

    static func summary(_ mapped: ChangeMapping.Mapped) -> [String] {
        mapped.messages.map { message in
            let data = message.data.objectValue!
            let audience = data["audience"]?.stringValue.map { " " + $0 } ?? ""
            let doc = data["doc"] == nil ? "" : " doc"
            return message.channel + audience + doc
        }
    }

    @Test func anInsertGoesToEveryRouteOfTheNewRow() {
        let mapped = Self.mapping.messages(
            for: Self.change(.insert, #"{"id":1,"owner_id":"a","team_id":"t"}"#), sourceID: "pg:s")
        #expect(Self.summary(mapped) == ["/users/a/notes doc", "/teams/t/notes doc"])
        #expect(mapped.unrouted.isEmpty)
        #expect(Set(mapped.messages.map(\.key)).count == 2, "each channel's message has its own key")
        #expect(mapped.messages.allSatisfy { $0.data.objectValue?["key"]?.stringValue == $0.key })
    }

    /// A move tells the old audience first that the row left (without the new values), then the new one.
    @Test func anUpdateThatMovesARowTellsBothAudiences() {
        let mapped = Self.mapping.messages(
            for: Self.change(
                .update, #"{"id":1,"owner_id":"b","team_id":"t"}"#,
                previous: #"{"id":1,"owner_id":"a","team_id":"t","body":"secret of a"}"#),
            sourceID: "pg:s")
        #expect(Self.summary(mapped) == ["/users/a/notes left", "/users/b/notes joined doc", "/teams/t/notes doc"])
        #expect(mapped.unrouted.isEmpty)
    }

    @Test func anUpdateThatStaysTellsItsAudienceOnly() {
        let mapped = Self.mapping.messages(
            for: Self.change(
                .update, #"{"id":1,"owner_id":"a","team_id":"t"}"#, previous: #"{"id":1,"owner_id":"a","team_id":"t"}"#),
            sourceID: "pg:s")
        #expect(Self.summary(mapped) == ["/users/a/notes doc", "/teams/t/notes doc"])
    }

    /// NULL to a value joins, a value to NULL leaves; the NULL side is counted only where it would have published.
    @Test func anUpdateToOrFromNullJoinsOrLeaves() {
        let gone = Self.mapping.messages(
            for: Self.change(
                .update, #"{"id":1,"owner_id":null,"team_id":"t"}"#, previous: #"{"id":1,"owner_id":"a","team_id":"t"}"#
            ),
            sourceID: "pg:s")
        #expect(Self.summary(gone) == ["/users/a/notes left", "/teams/t/notes doc"])
        #expect(gone.unrouted.map(\.reason) == [.null])
        let came = Self.mapping.messages(
            for: Self.change(
                .update, #"{"id":1,"owner_id":"a","team_id":"t"}"#, previous: #"{"id":1,"owner_id":null,"team_id":"t"}"#
            ),
            sourceID: "pg:s")
        #expect(Self.summary(came) == ["/users/a/notes joined doc", "/teams/t/notes doc"])
        #expect(came.unrouted.isEmpty)
    }

    @Test func aDeleteGoesToTheOldRowsAudience() {
        let mapped = Self.mapping.messages(
            for: Self.change(
                .delete, #"{"id":1,"owner_id":"a","team_id":"t"}"#, previous: #"{"id":1,"owner_id":"a","team_id":"t"}"#),
            sourceID: "pg:s")
        #expect(Self.summary(mapped) == ["/users/a/notes doc", "/teams/t/notes doc"])
        #expect(mapped.messages.allSatisfy { $0.data.objectValue?["op"] == "delete" })
    }

    /// Old values the source did not give (a tombstone, an identity without the column) are unknown, not NULL:
    /// the old audience cannot be told, and that is counted.
    @Test func unknownOldValuesAreCountedNotTakenForNull() {
        let tombstone = Self.mapping.messages(for: Self.change(.delete, #"{"_deleted":true}"#), sourceID: "s")
        #expect(tombstone.messages.isEmpty)
        #expect(tombstone.unrouted.map(\.reason) == [.noPrevious, .noPrevious])
        let keyOnly = Self.mapping.messages(
            for: Self.change(.update, #"{"id":1,"owner_id":"b","team_id":"t"}"#, previous: #"{"id":1}"#), sourceID: "s")
        #expect(
            Self.summary(keyOnly) == ["/users/b/notes joined doc", "/teams/t/notes joined doc"],
            "the client may not have the row: it is told to add it")
        #expect(keyOnly.unrouted.map(\.reason) == [.noPrevious, .noPrevious])
    }

    /// A route of source variables only (Simperium's `{user}`) routes a delete without any old values.
    @Test func aVariablesOnlyRouteNeedsNoOldValues() throws {
        let mapping = ChangeMapping(routes: [try Route(parsing: "notes=/users/{user}/notes")])
        let delete = Change(
            collection: ["notes"], id: "e1", operation: .delete, seq: "cv1", variables: ["user": "a@b.c"])
        let mapped = mapping.messages(for: delete, sourceID: "s")
        #expect(mapped.messages.map(\.channel) == ["/users/a@b$2Ec/notes"])
        #expect(mapped.unrouted.isEmpty)
    }

    @Test func aTruncateGoesToTheCollectionChannelOnly() {
        let mapped = Self.mapping.messages(
            for: Change(collection: ["public", "notes"], id: nil, operation: .truncate, seq: "0/1:1"), sourceID: "s")
        #expect(Self.summary(mapped) == ["/changes/public/notes"])
    }

    @Test func aCollectionWithoutRoutesKeepsTheLayout() {
        let change = Change(
            collection: ["public", "other"], id: "x y", operation: .insert, seq: "1", document: ["a": 1])
        let mapped = Self.mapping.messages(for: change, sourceID: "s")
        #expect(Self.summary(mapped) == ["/changes/public/other/x$20y doc"])
        #expect(mapped.messages[0].key == ChangeMapping.key(sourceID: "s", change: change))
    }

    @Test func twoRoutesGivingOneChannelSendOneMessage() throws {
        let mapping = ChangeMapping(routes: [try Route(parsing: "t.n=/u/{a}"), try Route(parsing: "t.n=/u/{b}")])
        let change = Change(
            collection: ["t", "n"], id: "1", operation: .insert, seq: "1", document: ["a": "x", "b": "x"])
        #expect(mapping.messages(for: change, sourceID: "s").messages.map(\.channel) == ["/u/x"])
    }

    /// An array field: members added join, members removed leave, those kept are told of the update.
    @Test func aFanOutUpdateTellsWhoJoinedAndWhoLeft() throws {
        let mapping = ChangeMapping(routes: [try Route(parsing: "db=/users/{doc.members[]}/docs")])
        let change = Change(
            collection: ["db"], id: "d", operation: .update, seq: "2",
            document: Self.row(#"{"members":["a","c"]}"#), previous: Self.row(#"{"members":["a","b"]}"#))
        #expect(
            Self.summary(mapping.messages(for: change, sourceID: "s")) == [
                "/users/b/docs left", "/users/a/docs", "/users/c/docs joined",
            ])
    }
}
