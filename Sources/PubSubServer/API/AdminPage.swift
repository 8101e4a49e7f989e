/// The dashboard at `/admin`: one page, inline CSS and JS, no external assets.
enum AdminPage {
    static let html = #"""
<!doctype html><html><head><meta charset="utf-8"><title>pubsub</title></head><body>pubsub</body></html>
"""#
}
