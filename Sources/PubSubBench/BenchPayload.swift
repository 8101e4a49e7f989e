import NIOCore

/// What each published message's `data` holds beside the bench marker. `filler` is the marker padded with `x` to
/// `--size` bytes (what every earlier run measured); the others are JSON shaped like what applications publish, for
/// measuring compression, where filler bytes would flatter it: repeated keys, numbers, timestamps, identifiers and
/// some prose, drawn from a generator seeded by the sequence number, so every run publishes the same bytes for
/// the same sequence (only the marker's send time differs).
public enum BenchPayload: String, CaseIterable, Sendable {
    case filler
    /// A background job's progress, about 1 KiB: the job, then each of its steps with name, status, percent and
    /// timestamps (the same keys again and again).
    case jobProgress = "job-progress"
    /// A changed row as a change feed sends it, about 4 KiB: about forty fields, two nested addresses, tags,
    /// preferences and a note.
    case changeDoc = "change-doc"

    /// Writes the `data` object: `{"_pb":[publisher,channel,sequence,sentAt]` then the payload's fields, `}`.
    /// `size` is the filler's target length (the other payloads have their own).
    func write(
        into buffer: inout ByteBuffer, publisher: Int, channel: Int, sequence: UInt32, sentAt: UInt64, size: Int
    ) {
        let start = buffer.writerIndex
        buffer.writeStaticString("{\"_pb\":[")
        buffer.writeString(String(publisher))
        buffer.writeInteger(UInt8(ascii: ","))
        buffer.writeString(String(channel))
        buffer.writeInteger(UInt8(ascii: ","))
        buffer.writeString(String(sequence))
        buffer.writeInteger(UInt8(ascii: ","))
        buffer.writeString(String(sentAt))
        buffer.writeInteger(UInt8(ascii: "]"))
        switch self {
        case .filler:
            buffer.writeStaticString(",\"x\":\"")
            var padding = size - (buffer.writerIndex - start) - 2
            while padding > 0 {
                let n = min(padding, Self.pad.count)
                buffer.writeBytes(Self.pad[0..<n])
                padding -= n
            }
            buffer.writeStaticString("\"}")
        case .jobProgress:
            var w = JSONWriter(buffer: buffer, seed: UInt64(sequence))
            w.jobProgress(sequence: sequence)
            buffer = w.buffer
            buffer.writeInteger(UInt8(ascii: "}"))
        case .changeDoc:
            var w = JSONWriter(buffer: buffer, seed: UInt64(sequence) &+ 0xC4A9_6E00)
            w.changeDoc(sequence: sequence)
            buffer = w.buffer
            buffer.writeInteger(UInt8(ascii: "}"))
        }
    }

    private static let pad = [UInt8](repeating: UInt8(ascii: "x"), count: 4096)
}

/// Writes the realistic payloads' fields (each preceded by a comma: they follow the marker).
private struct JSONWriter {
    var buffer: ByteBuffer
    var random: SplitMix64

    init(buffer: ByteBuffer, seed: UInt64) {
        self.buffer = buffer
        self.random = SplitMix64(seed: seed)
    }

    mutating func pick(_ n: Int) -> Int { Int(random.next() % UInt64(n)) }

    mutating func pick<T>(_ values: [T]) -> T { values[pick(values.count)] }

    mutating func key(_ name: StaticString, first: Bool = false) {
        if !first { buffer.writeInteger(UInt8(ascii: ",")) }
        buffer.writeInteger(UInt8(ascii: "\""))
        buffer.writeStaticString(name)
        buffer.writeStaticString("\":")
    }

    mutating func string(_ name: StaticString, _ value: String, first: Bool = false) {
        key(name, first: first)
        buffer.writeInteger(UInt8(ascii: "\""))
        buffer.writeString(value)
        buffer.writeInteger(UInt8(ascii: "\""))
    }

    mutating func number(_ name: StaticString, _ value: Int, first: Bool = false) {
        key(name, first: first)
        buffer.writeString(String(value))
    }

    mutating func bool(_ name: StaticString, _ value: Bool, first: Bool = false) {
        key(name, first: first)
        buffer.writeString(value ? "true" : "false")
    }

    mutating func null(_ name: StaticString) {
        key(name)
        buffer.writeStaticString("null")
    }

    /// `2026-11-28T01:23:45.678Z`, `milliseconds` after the start of that day (wrapping within it).
    static func timestamp(_ milliseconds: Int) -> String {
        let ms = milliseconds % 86_400_000
        let h = ms / 3_600_000
        let m = ms / 60_000 % 60
        let s = ms / 1000 % 60
        func two(_ v: Int) -> String { v < 10 ? "0\(v)" : String(v) }
        let frac = ms % 1000
        let three = frac < 10 ? "00\(frac)" : frac < 100 ? "0\(frac)" : String(frac)
        return "2026-11-28T\(two(h)):\(two(m)):\(two(s)).\(three)Z"
    }

    mutating func hex(_ digits: Int) -> String {
        let alphabet = Array("0123456789abcdef")
        return String((0..<digits).map { _ in alphabet[pick(16)] })
    }

    mutating func words(_ count: Int) -> String {
        (0..<count).map { _ in pick(Self.vocabulary) }.joined(separator: " ")
    }

    // MARK: job-progress

    mutating func jobProgress(sequence: UInt32) {
        let seq = Int(sequence)
        let base = seq * 250
        let steps = Self.steps
        let current = seq % (steps.count + 1)
        let jobId = "job_" + hex(12)
        string("type", "job.progress")
        string("job_id", jobId)
        string("queue", pick(["reports.export", "media.transcode", "billing.invoices", "search.reindex"]))
        number("attempt", 1 + pick(3))
        string("status", current == steps.count ? "succeeded" : "running")
        number("percent", current * 100 / steps.count)
        string("current_step", current < steps.count ? steps[current] : "done")
        string("started_at", Self.timestamp(base))
        string("updated_at", Self.timestamp(base + 200 + pick(50)))
        key("steps")
        buffer.writeInteger(UInt8(ascii: "["))
        var t = base
        for (i, name) in steps.enumerated() {
            if i > 0 { buffer.writeInteger(UInt8(ascii: ",")) }
            buffer.writeInteger(UInt8(ascii: "{"))
            string("name", name, first: true)
            let status = i < current ? "done" : i == current ? "running" : "pending"
            string("status", status)
            number("percent", i < current ? 100 : i == current ? pick(100) : 0)
            if i <= current {
                string("started_at", Self.timestamp(t))
                t += 5 + pick(40)
            } else {
                null("started_at")
            }
            if i < current { string("finished_at", Self.timestamp(t)) } else { null("finished_at") }
            buffer.writeInteger(UInt8(ascii: "}"))
        }
        buffer.writeInteger(UInt8(ascii: "]"))
        key("worker")
        buffer.writeInteger(UInt8(ascii: "{"))
        string("host", "worker-\(pick(16)).jobs.internal", first: true)
        number("pid", 1000 + pick(60000))
        buffer.writeInteger(UInt8(ascii: "}"))
    }

    static let steps = [
        "fetch_source", "validate_input", "render_pages", "compress_output", "upload_artifact", "notify_owner",
    ]

    // MARK: change-doc

    mutating func changeDoc(sequence: UInt32) {
        let seq = Int(sequence)
        let id = 100_000 + seq % 50_000
        let first = pick(Self.firstNames)
        let last = pick(Self.lastNames)
        let company = pick(Self.companies)
        let domain = String(company.lowercased().filter { $0 != " " }) + ".example"
        string("op", "update")
        string("table", "customers")
        string("id", "cus_\(id)")
        string("rev", "\(1 + seq % 40)-\(hex(32))")
        string("ts", Self.timestamp(seq * 250))
        key("doc")
        buffer.writeInteger(UInt8(ascii: "{"))
        string("id", "cus_\(id)", first: true)
        string("account_id", "acct_\(hex(10))")
        string("first_name", first)
        string("last_name", last)
        string("display_name", "\(first) \(last)")
        string("email", "\(first.lowercased()).\(last.lowercased())@\(domain)")
        string("phone", "+1-555-\(100 + pick(900))-\(1000 + pick(9000))")
        string("mobile", "+1-555-\(100 + pick(900))-\(1000 + pick(9000))")
        string("company", company)
        string(
            "job_title",
            pick(["Engineering Manager", "Head of Operations", "Accountant", "Product Designer", "CTO", "Support Lead"])
        )
        string("department", pick(["engineering", "operations", "finance", "design", "support", "sales"]))
        string("status", pick(["active", "trialing", "past_due", "active", "active"]))
        string("plan", pick(["starter", "team", "business", "enterprise"]))
        number("seats", 1 + pick(250))
        number("mrr_cents", 1900 + pick(500_000))
        string("currency", pick(["USD", "EUR", "GBP", "CAD"]))
        string("locale", pick(["en-US", "en-GB", "fr-FR", "de-DE", "es-ES"]))
        string(
            "timezone",
            pick(["America/New_York", "Europe/London", "Europe/Paris", "Asia/Tokyo", "America/Los_Angeles"]))
        string("created_at", Self.timestamp(pick(80_000_000)))
        string("updated_at", Self.timestamp(seq * 250))
        string("last_login_at", Self.timestamp(seq * 250 - pick(3_600_000) + 3_600_000))
        number("login_count", pick(5000))
        bool("email_verified", pick(10) > 0)
        bool("two_factor_enabled", pick(2) == 0)
        bool("marketing_opt_in", pick(3) == 0)
        bool("newsletter", pick(2) == 0)
        string("referral_code", hex(8).uppercased())
        string("source", pick(["organic", "paid_search", "partner", "referral", "event"]))
        string("utm_campaign", pick(["spring_launch", "black_friday", "webinar_q3", "none"]))
        number("health_score", pick(101))
        string("risk", pick(["low", "medium", "high"]))
        string("owner_id", "usr_\(hex(10))")
        string("avatar_url", "https://cdn.\(domain)/avatars/\(hex(16)).png")
        string("website", "https://www.\(domain)/")
        for name: StaticString in ["address", "billing_address"] {
            key(name)
            buffer.writeInteger(UInt8(ascii: "{"))
            string("street", "\(1 + pick(9999)) \(pick(Self.streets))", first: true)
            string("line2", pick(["", "Suite \(100 + pick(900))", "Floor \(1 + pick(40))"]))
            let city = pick(Self.cities)
            string("city", city.0)
            string("region", city.1)
            string("postal_code", String(10000 + pick(89999)))
            string("country", city.2)
            buffer.writeInteger(UInt8(ascii: "}"))
        }
        key("tags")
        buffer.writeInteger(UInt8(ascii: "["))
        for i in 0..<(3 + pick(5)) {
            if i > 0 { buffer.writeInteger(UInt8(ascii: ",")) }
            buffer.writeInteger(UInt8(ascii: "\""))
            buffer.writeString(pick(Self.tags))
            buffer.writeInteger(UInt8(ascii: "\""))
        }
        buffer.writeInteger(UInt8(ascii: "]"))
        key("preferences")
        buffer.writeInteger(UInt8(ascii: "{"))
        string("theme", pick(["light", "dark", "system"]), first: true)
        string("digest", pick(["daily", "weekly", "never"]))
        key("notifications")
        buffer.writeInteger(UInt8(ascii: "{"))
        bool("email", true, first: true)
        bool("sms", pick(2) == 0)
        bool("push", pick(2) == 0)
        buffer.writeStaticString("}}")
        key("custom_fields")
        buffer.writeInteger(UInt8(ascii: "{"))
        string("crm_id", "00Q\(hex(15))", first: true)
        string("industry", pick(["software", "retail", "healthcare", "logistics", "education"]))
        number("employees", 5 + pick(20000))
        string("renewal_date", Self.timestamp(pick(86_000_000)))
        buffer.writeInteger(UInt8(ascii: "}"))
        key("contacts")
        buffer.writeInteger(UInt8(ascii: "["))
        for i in 0..<3 {
            if i > 0 { buffer.writeInteger(UInt8(ascii: ",")) }
            let name = "\(pick(Self.firstNames)) \(pick(Self.lastNames))"
            buffer.writeInteger(UInt8(ascii: "{"))
            string("name", name, first: true)
            string("email", "\(name.lowercased().filter { $0 != " " })@\(domain)")
            string("phone", "+1-555-\(100 + pick(900))-\(1000 + pick(9000))")
            string("role", pick(["billing", "technical", "executive", "admin"]))
            buffer.writeInteger(UInt8(ascii: "}"))
        }
        buffer.writeInteger(UInt8(ascii: "]"))
        string("notes", words(150))
        buffer.writeInteger(UInt8(ascii: "}"))
        key("previous")
        buffer.writeInteger(UInt8(ascii: "{"))
        string("status", pick(["trialing", "past_due", "active"]), first: true)
        string("updated_at", Self.timestamp(seq * 250 - 250 + 86_400_000))
        string("last_login_at", Self.timestamp(pick(80_000_000)))
        buffer.writeInteger(UInt8(ascii: "}"))
        key("history")
        buffer.writeInteger(UInt8(ascii: "["))
        for i in 0..<6 {
            if i > 0 { buffer.writeInteger(UInt8(ascii: ",")) }
            buffer.writeInteger(UInt8(ascii: "{"))
            string("at", Self.timestamp(seq * 250 + 86_400_000 - (6 - i) * 3_600_000), first: true)
            string("by", "usr_\(hex(10))")
            string("field", pick(["status", "plan", "seats", "owner_id", "tags", "billing_address"]))
            string("from", pick(["trialing", "team", "12", "usr_3f9a0c", "starter", "past_due"]))
            string("to", pick(["active", "business", "25", "usr_81be22", "team", "active"]))
            buffer.writeInteger(UInt8(ascii: "}"))
        }
        buffer.writeInteger(UInt8(ascii: "]"))
        key("changed")
        buffer.writeStaticString("[\"status\",\"updated_at\",\"last_login_at\",\"tags\"]")
    }

    static let firstNames = [
        "Ada", "Grace", "Alan", "Linus", "Margaret", "Dennis", "Barbara", "Ken", "Radia", "Edsger",
        "Frances", "Donald", "Hedy", "Tim", "Katherine", "John",
    ]
    static let lastNames = [
        "Lovelace", "Hopper", "Turing", "Torvalds", "Hamilton", "Ritchie", "Liskov", "Thompson",
        "Perlman", "Dijkstra", "Allen", "Knuth", "Lamarr", "Berners-Lee", "Johnson", "Backus",
    ]
    static let companies = [
        "Acme Corp", "Globex", "Initech", "Umbrella", "Hooli", "Stark Industries", "Wayne Enterprises",
        "Soylent", "Tyrell", "Cyberdyne",
    ]
    static let streets = [
        "Market Street", "Mission Street", "Elm Avenue", "Oak Lane", "High Street", "Rue de Rivoli",
        "King Street", "Baker Street",
    ]
    static let cities: [(String, String, String)] = [
        ("San Francisco", "CA", "US"), ("New York", "NY", "US"),
        ("London", "England", "GB"), ("Paris", "Ile-de-France", "FR"), ("Berlin", "Berlin", "DE"),
        ("Toronto", "ON", "CA"), ("Austin", "TX", "US"), ("Madrid", "Madrid", "ES"),
    ]
    static let tags = [
        "vip", "beta", "churn-risk", "enterprise", "annual", "monthly", "partner", "edu", "nonprofit",
        "migrated", "sso", "priority-support", "expansion", "renewal-q1",
    ]
    static let vocabulary = [
        "the", "customer", "asked", "about", "invoice", "renewal", "and", "wants", "to", "upgrade",
        "their", "plan", "before", "next", "quarter", "call", "scheduled", "with", "finance", "team", "regarding",
        "seats", "discount", "approved", "pending", "legal", "review", "of", "contract", "terms", "follow", "up",
        "on", "integration", "issue", "reported", "last", "week", "support", "ticket", "resolved", "migration",
        "from", "legacy", "system", "completed", "training", "session", "for", "new", "admins", "requested",
        "export", "data", "warehouse", "sync", "delayed", "by", "two", "days", "sent", "summary", "email",
    ]
}
