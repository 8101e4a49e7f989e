import Foundation

/// SASLprep (RFC 4013, the stringprep profile of RFC 3454) of a SCRAM password, as PostgreSQL applies it on both
/// sides (`src/common/saslprep.c`): an ASCII password is used as it is; any other is mapped (non-ASCII spaces to a
/// space, the characters "commonly mapped to nothing" removed) and normalized (NFKC). A password that comes out
/// empty, or whose mapped form holds a prohibited or (in Unicode 3.2) unassigned code point, or breaks the
/// bidirectional rule, is used as it was given: the server stored its verifier from the raw bytes then too.
///
/// The bidirectional rule's "left-to-right" side (RFC 3454 table D.2, about 360 ranges) is taken as the letters,
/// spacing marks and letter numbers outside table D.1: a password mixing right-to-left letters with other
/// left-to-right symbols (a circled Latin letter, say) may be prepared where PostgreSQL keeps it raw.
enum SASLprep {
    static func prepare(_ password: String) -> String {
        if password.utf8.allSatisfy({ $0 < 0x80 }) { return password }
        var mapped = String.UnicodeScalarView()
        for scalar in password.unicodeScalars {
            if nonASCIISpaces.contains(where: { $0.contains(scalar.value) }) {
                mapped.append(" ")
            } else if !mappedToNothing.contains(where: { $0.contains(scalar.value) }) {
                mapped.append(scalar)
            }
        }
        guard let first = mapped.first, let last = mapped.last else { return password }
        // PostgreSQL checks the mapped form (before normalization) for prohibited code points and direction.
        for scalar in mapped where isProhibited(scalar) || isUnassigned(scalar) { return password }
        if mapped.contains(where: isRightToLeft) {
            guard isRightToLeft(first), isRightToLeft(last), !mapped.contains(where: isLeftToRight) else {
                return password
            }
        }
        return String(mapped).precomposedStringWithCompatibilityMapping
    }

    /// RFC 3454 C.1.2, mapped to U+0020.
    static let nonASCIISpaces: [ClosedRange<UInt32>] = [
        0x00A0...0x00A0, 0x1680...0x1680, 0x2000...0x200B, 0x202F...0x202F, 0x205F...0x205F, 0x3000...0x3000,
    ]

    /// RFC 3454 B.1, removed.
    static let mappedToNothing: [ClosedRange<UInt32>] = [
        0x00AD...0x00AD, 0x034F...0x034F, 0x1806...0x1806, 0x180B...0x180D, 0x200B...0x200D, 0x2060...0x2060,
        0xFE00...0xFE0F, 0xFEFF...0xFEFF,
    ]

    /// RFC 3454 C.1.2, C.2.1, C.2.2, C.3, C.4, C.5, C.6, C.7, C.8 and C.9.
    static let prohibited: [ClosedRange<UInt32>] = [
        0x0000...0x001F, 0x007F...0x00A0, 0x0340...0x0341, 0x06DD...0x06DD, 0x070F...0x070F, 0x1680...0x1680,
        0x180E...0x180E, 0x2000...0x200F, 0x2028...0x202F, 0x205F...0x2063, 0x206A...0x206F, 0x2FF0...0x2FFB,
        0x3000...0x3000, 0xD800...0xF8FF, 0xFDD0...0xFDEF, 0xFEFF...0xFEFF, 0xFFF9...0xFFFF, 0x1D173...0x1D17A,
        0xE0001...0xE0001, 0xE0020...0xE007F, 0xF0000...0x10FFFF,
    ]

    /// RFC 3454 D.1: characters of bidirectional class R or AL.
    static let rightToLeft: [ClosedRange<UInt32>] = [
        0x05BE...0x05BE, 0x05C0...0x05C0, 0x05C3...0x05C3, 0x05D0...0x05EA, 0x05F0...0x05F4, 0x061B...0x061B,
        0x061F...0x061F, 0x0621...0x063A, 0x0640...0x064A, 0x066D...0x066F, 0x0671...0x06D5, 0x06DD...0x06DD,
        0x06E5...0x06E6, 0x06FA...0x06FE, 0x0700...0x070D, 0x0710...0x0710, 0x0712...0x072C, 0x0780...0x07A5,
        0x07B1...0x07B1, 0x200F...0x200F, 0xFB1D...0xFB1D, 0xFB1F...0xFB28, 0xFB2A...0xFB36, 0xFB38...0xFB3C,
        0xFB3E...0xFB3E, 0xFB40...0xFB41, 0xFB43...0xFB44, 0xFB46...0xFBB1, 0xFBD3...0xFD3D, 0xFD50...0xFD8F,
        0xFD92...0xFDC7, 0xFDF0...0xFDFC, 0xFE70...0xFE74, 0xFE76...0xFEFC,
    ]

    static func isProhibited(_ scalar: Unicode.Scalar) -> Bool {
        // Every plane's last two code points are non-characters (C.4).
        scalar.value & 0xFFFE == 0xFFFE || prohibited.contains { $0.contains(scalar.value) }
    }

    /// Not assigned in Unicode 3.2 (RFC 3454 A.1).
    static func isUnassigned(_ scalar: Unicode.Scalar) -> Bool {
        guard let age = scalar.properties.age else { return true }
        return age.major > 3 || (age.major == 3 && age.minor > 2)
    }

    static func isRightToLeft(_ scalar: Unicode.Scalar) -> Bool {
        rightToLeft.contains { $0.contains(scalar.value) }
    }

    static func isLeftToRight(_ scalar: Unicode.Scalar) -> Bool {
        guard !isRightToLeft(scalar) else { return false }
        switch scalar.properties.generalCategory {
        case .uppercaseLetter, .lowercaseLetter, .titlecaseLetter, .modifierLetter, .otherLetter, .spacingMark,
            .letterNumber:
            return true
        default: return false
        }
    }
}
