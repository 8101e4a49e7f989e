import NIOCore
import NIOHTTP1

/// The static files under the mount: the browser client, at `<mount>/client.js` (Faye's URL) and `<mount>.js`
/// (PrivatePub loads `<server>.js`), validated with `ETag` and `Last-Modified` as Faye serves its bundle.
enum StaticFiles {
    /// Names, relative to the mount, that serve the client: `.js` is `<mount>.js`; the `faye-browser` names
    /// are the ones Faye's gem serves from its build directory.
    static let clientNames: Set<String> = [".js", "client.js", "faye-browser.js", "faye-browser-min.js"]

    static let clientBody = ByteBuffer(string: BrowserClient.source)
    static let lastModifiedSeconds = HTTPDate.parse(BrowserClient.lastModified)

    /// The response for a static `name`, or nil when there is no such file.
    static func response(name: String, method: HTTPMethod, requestHeaders: HTTPHeaders) -> HTTPResponse? {
        guard clientNames.contains(name) else { return nil }
        var headers = HTTPHeaders()
        guard method == .GET || method == .HEAD else {
            headers.add(name: "Allow", value: "GET, HEAD")
            headers.add(name: "Content-Type", value: "text/plain; charset=utf-8")
            return HTTPResponse(
                status: .methodNotAllowed, headers: headers, body: ByteBuffer(string: "Method not allowed\n"))
        }
        headers.add(name: "ETag", value: BrowserClient.etag)
        headers.add(name: "Last-Modified", value: BrowserClient.lastModified)
        headers.add(name: "Cache-Control", value: "no-cache")
        if notModified(requestHeaders) {
            return HTTPResponse(status: .notModified, headers: headers, body: ByteBuffer())
        }
        headers.add(name: "Content-Type", value: "text/javascript; charset=utf-8")
        headers.add(name: "X-Content-Type-Options", value: "nosniff")
        // The body of a GET, on a HEAD too: the responder sends its length and leaves it out.
        return HTTPResponse(status: .ok, headers: headers, body: clientBody)
    }

    /// `If-None-Match` decides when present (weak comparison, `*` matches); otherwise `If-Modified-Since`.
    static func notModified(_ headers: HTTPHeaders) -> Bool {
        let tags = headers["if-none-match"]
        if !tags.isEmpty {
            for list in tags {
                for raw in list.split(separator: ",") {
                    var tag = raw.trimmingSpaces()
                    if tag == "*" { return true }
                    if tag.hasPrefix("W/") { tag = String(tag.dropFirst(2)) }
                    if tag == BrowserClient.etag { return true }
                }
            }
            return false
        }
        guard let since = headers.first(name: "if-modified-since").flatMap(HTTPDate.parse),
            let modified = lastModifiedSeconds
        else { return false }
        return modified <= since
    }
}

extension Substring {
    fileprivate func trimmingSpaces() -> String {
        String(drop(while: { $0 == " " || $0 == "\t" }).reversed().drop(while: { $0 == " " || $0 == "\t" }).reversed())
    }
}

/// IMF-fixdate, the HTTP date format: `Sun, 06 Nov 1994 08:49:37 GMT`.
enum HTTPDate {
    static let months = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"]

    /// Seconds since the epoch, or nil if `text` is not an IMF-fixdate.
    static func parse(_ text: String) -> Int64? {
        let parts = text.split(separator: " ")
        guard parts.count == 6, parts[5] == "GMT", let day = Int64(parts[1]), let year = Int64(parts[3]),
            let monthIndex = months.firstIndex(of: String(parts[2]))
        else { return nil }
        let clock = parts[4].split(separator: ":").compactMap { Int64($0) }
        guard clock.count == 3, (1...31).contains(day), (0...23).contains(clock[0]), (0...59).contains(clock[1]),
            (0...60).contains(clock[2])
        else { return nil }
        return daysFromCivil(year: year, month: Int64(monthIndex + 1), day: day) * 86400
            + clock[0] * 3600 + clock[1] * 60 + clock[2]
    }

    /// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm).
    static func daysFromCivil(year: Int64, month: Int64, day: Int64) -> Int64 {
        let y = month <= 2 ? year - 1 : year
        let era = (y >= 0 ? y : y - 399) / 400
        let yearOfEra = y - era * 400
        let dayOfYear = (153 * (month + (month > 2 ? -3 : 9)) + 2) / 5 + day - 1
        let dayOfEra = yearOfEra * 365 + yearOfEra / 4 - yearOfEra / 100 + dayOfYear
        return era * 146097 + dayOfEra - 719468
    }
}
