import Bayeux
import Foundation
import Testing

@Suite struct DurableFileTests {
    struct Injected: Error {}

    private func folder() throws -> String {
        let path = NSTemporaryDirectory() + "durable-" + UUID().uuidString
        try FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true)
        return path
    }

    private func content(_ path: String) -> String? {
        FileManager.default.contents(atPath: path).map { String(decoding: $0, as: UTF8.self) }
    }

    @Test(arguments: [true, false]) func replacesTheWholeFileAndLeavesNoTemporary(durable: Bool) throws {
        let path = try folder() + "/file"
        try DurableFile.replace(path, with: Array("a longer first content\n".utf8), durable: durable)
        try DurableFile.replace(path, with: Array("short\n".utf8), durable: durable)
        #expect(content(path) == "short\n")
        #expect(!FileManager.default.fileExists(atPath: path + ".tmp"))
    }

    @Test func takesEveryStepInOrderAndOnlyTheUnsyncedOnesWhenNotDurable() throws {
        let path = try folder() + "/file"
        var durable: [DurableFile.Step] = []
        try DurableFile.replace(path, with: [1], durable: true) { durable.append($0) }
        #expect(durable == DurableFile.Step.allCases)
        var quick: [DurableFile.Step] = []
        try DurableFile.replace(path, with: [2], durable: false) { quick.append($0) }
        #expect(quick == [.writeTemporary, .rename])
    }

    @Test(arguments: DurableFile.Step.allCases) func aFailureBeforeAStepLeavesTheOldOrTheNewContent(
        step: DurableFile.Step
    ) throws {
        let path = try folder() + "/file"
        try DurableFile.replace(path, with: Array("old".utf8), durable: true)
        #expect(throws: Injected.self) {
            try DurableFile.replace(path, with: Array("new".utf8), durable: true) { if $0 == step { throw Injected() } }
        }
        // Until the rename the old content stands; from the rename on the new one does.
        #expect(content(path) == (step == .syncDirectory ? "new" : "old"))
    }

    @Test func aMissingFolderNamesTheStepThePathAndTheErrno() throws {
        let path = "/nonexistent-\(UUID().uuidString)/file"
        let error = #expect(throws: DurableFile.Error.self) {
            try DurableFile.replace(path, with: [1], durable: true)
        }
        #expect(error?.operation == .create)
        #expect(error?.path == path + ".tmp")
        #expect(error?.code == ENOENT)
        #expect(error?.description == "create \(path).tmp: No such file or directory")
    }

    @Test func aFolderInTheWayOfTheRenameIsARenameError() throws {
        let path = try folder() + "/file"
        try FileManager.default.createDirectory(atPath: path + "/inside", withIntermediateDirectories: true)
        let error = #expect(throws: DurableFile.Error.self) {
            try DurableFile.replace(path, with: [1], durable: false)
        }
        #expect(error?.operation == .rename)
        #expect(error?.path == path)
        #expect(error?.code == EISDIR || error?.code == ENOTEMPTY || error?.code == EEXIST)
    }

    @Test func theFolderOfAPath() {
        #expect(DurableFile.directory(of: "positions.json") == ".")
        #expect(DurableFile.directory(of: "/positions.json") == "/")
        #expect(DurableFile.directory(of: "/var/lib/pubsub/checkpoint") == "/var/lib/pubsub")
        #expect(DurableFile.temporaryPath(of: "/var/lib/checkpoint") == "/var/lib/checkpoint.tmp")
    }
}
